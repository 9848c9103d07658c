"""``lumenrt serve --model-dir DIR [--model-name NAME]``: what a platform mounts, served as it is.

KServe mounts an InferenceService's storage at ``/mnt/models``, and that storage is usually one
model's files (``model.onnx``), not a repository. So ``DIR`` may be either:

  - a repository (``<model>/config.yaml`` + ``<model>/<version>/...``): served as ``--repository``;
  - one model's folder: a model file a bundled backend reads (``model.onnx``; ``model.json``,
    ``model.ubj`` or ``model.bst`` for XGBoost; ``model.pt`` or ``model.pt2``; ``model.py``) and
    optionally a ``config.yaml`` beside it. It is served as model ``NAME`` (default: the folder's
    name), version 1, through a repository of links made in a temporary folder: ``NAME/1`` links
    to ``DIR``, and ``NAME/config.yaml`` is the folder's own config (its ``name`` key dropped: the
    model is called ``NAME``) or, without one, ``{backend: <the file's>}``, the inputs and outputs
    read from the model file where its backend can (ONNX; XGBoost's feature count).

Nothing under ``DIR`` is written (platforms mount it read-only).
"""

import json
import re
from pathlib import Path

from lumenrt.backends.base import BUNDLED_MODEL_FILES
from lumenrt.engine.config import ConfigError, read_config_file
from lumenrt.engine.repository import CONFIG_FILES, ModelRepository

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")


def is_repository(folder: Path) -> bool:
    return any((sub / f).is_file() for sub in folder.iterdir() if sub.is_dir() for f in CONFIG_FILES)


def repository_for(model_dir: Path, name: str | None, work: Path) -> ModelRepository:
    """The repository to serve for ``model_dir`` (see the top); links are made under ``work``, and
    the repository trusts them to lead into ``model_dir``."""
    if not model_dir.is_dir():
        raise ConfigError(str(model_dir), "", "--model-dir: not a folder")
    if is_repository(model_dir):
        if name is not None:
            raise ConfigError(
                str(model_dir),
                "",
                "--model-name names the model of a one-model folder, but this is a repository",
            )
        return ModelRepository(model_dir)
    files = [f for f in BUNDLED_MODEL_FILES if (model_dir / f).is_file()]
    if len(files) != 1:
        found = f"found {files}" if files else "found none"
        raise ConfigError(
            str(model_dir),
            "",
            "--model-dir: neither a repository (<model>/config.yaml) nor one model's folder with one "
            f"model file ({', '.join(BUNDLED_MODEL_FILES)}): {found}",
        )
    name = name or model_dir.resolve().name
    if not _NAME.fullmatch(name):
        raise ConfigError(
            str(model_dir), "", f"--model-name: {name!r} is not a model name (letters, digits, _ . -)"
        )
    config: dict[str, object] = {"backend": BUNDLED_MODEL_FILES[files[0]]}
    own = [model_dir / f for f in CONFIG_FILES if (model_dir / f).is_file()]
    if own:
        config = {k: v for k, v in read_config_file(own[0]).items() if k != "name"}
    folder = work / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "1").symlink_to(model_dir.resolve(), target_is_directory=True)
    return ModelRepository(work, trusted=(model_dir,))
