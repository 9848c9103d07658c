"""The built-in INT8 variants, ``digits_mlp_int8`` and ``squeezenet_int8``: the FP32 built-ins
quantized by ``lumenrt quantize``'s code path (quantize/, its ``auto`` settings) with the models'
own calibration data, and compared with them on their own held-out data.

They are optional models of the built-in repository (``builtin.ensure_builtin_model``): built on
first request, cached beside the others, and served only when named (``lumenrt serve --models
digits_mlp_int8 ...``); ``lumenrt serve`` alone serves ``MODEL_NAMES``. Building them costs more
than the rest of a start (measured: see the README's "Quantization" section), and most starts do
not want them.

Each one's config is its FP32 model's, plus ``parameters.quantization``: the settings, the
calibration set and the agreement measured when it was built.
"""

from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any

from lumenrt.models.builtin import MODEL_NAMES, ensure_builtin_model, ensure_builtin_repository

INT8_MODELS = {"digits_mlp_int8": "digits_mlp", "squeezenet_int8": "squeezenet"}  # variant -> FP32 model


def builtin_models(
    models: Iterable[str] | None = None, cache_dir: Path | str | None = None
) -> tuple[Path, list[str]]:
    """The built-in repository and the models to serve from it: ``models`` (the INT8 variants
    among them built first where they are not yet), or by default ``MODEL_NAMES``."""
    repo = ensure_builtin_repository(cache_dir)
    if models is None:
        return repo, list(MODEL_NAMES)
    names = list(models)
    for name in names:
        if name in INT8_MODELS:
            ensure_builtin_model(name, partial(write, name), cache_dir)
    return repo, names


def write(name: str, repo: Path, model_dir: Path) -> dict[str, Any]:
    """Quantize ``INT8_MODELS[name]`` of ``repo`` into ``model_dir/1/model.onnx``; its config."""
    import yaml

    from lumenrt.quantize.agreement import compare, score_output
    from lumenrt.quantize.calibration import CALIBRATION_SAMPLES, read_samples
    from lumenrt.quantize.model_source import BUILTIN_PREFIX, open_model, preferred_batch
    from lumenrt.quantize.quantizer import quantize_model, resolve_settings
    from lumenrt.quantize.timing import make_session

    fp32 = INT8_MODELS[name]
    source = open_model(str(repo / fp32 / "1" / "model.onnx"))
    own = BUILTIN_PREFIX + fp32
    settings = resolve_settings(source)
    calibration = None
    if settings.method == "static":
        calibration = read_samples(own, source.inputs, "--calibration", CALIBRATION_SAMPLES, held_out=False)
    (model_dir / "1").mkdir()
    out = model_dir / "1" / "model.onnx"
    preprocess = quantize_model(source.path, out, settings, calibration, source.fixed_batch)
    held_out = read_samples(own, source.inputs, "--held-out", None, held_out=True)
    fp32_session, int8_session = (
        make_session(p, 1, source.session_options, name) for p in (source.path, out)
    )
    output = score_output(fp32_session.get_outputs(), None)
    agreement = compare(fp32_session, int8_session, held_out, output, preferred_batch(source, None))
    config: dict[str, Any] = yaml.safe_load((repo / fp32 / "config.yaml").read_text())
    config["parameters"] = {
        **config.get("parameters", {}),
        "quantization": {
            "from": fp32,
            **settings.to_json(),
            "preprocess": preprocess,
            "calibration": None
            if calibration is None
            else {"source": calibration.source, "samples": calibration.count},
            **agreement.to_json(),
        },
    }
    return config
