"""``lumenrt quantize``: every bad argument is one line on stderr naming it, and exit status 2,
before anything is quantized (no output file appears)."""

from pathlib import Path

import numpy as np
import pytest

from lumenrt.cli import main
from tests.quantize_models import convnet, header_only_npy, images, mlp, sample_folder, two_inputs


def refused(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> str:
    """Run the command; assert exit 2 and one line on stderr; return that line."""
    assert main(["quantize", *map(str, argv)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lumenrt quantize: ") and err.count("\n") == 1, err
    return err


@pytest.fixture
def conv(tmp_path: Path) -> Path:
    return convnet(tmp_path / "conv.onnx")


def test_missing_model_file_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    err = refused(capsys, tmp_path / "nope.onnx", "--out", tmp_path / "q.onnx")
    assert "MODEL" in err and "nope.onnx: no such file" in err
    assert not (tmp_path / "q.onnx").exists()


@pytest.mark.parametrize("content", [b"", b"not a model at all\n", bytes(range(256))])
def test_a_file_that_is_not_onnx_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes
) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(content)
    assert "not an ONNX model" in refused(capsys, bad, "--out", tmp_path / "q.onnx")


def test_unknown_builtin_is_refused_with_the_close_name(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    err = refused(capsys, "builtin:digits", "--out", tmp_path / "q.onnx")
    assert "MODEL builtin:digits" in err and "did you mean builtin:digits_mlp?" in err


def test_builtin_that_is_not_onnx_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    err = refused(capsys, "builtin:tabular_xgb", "--out", tmp_path / "q.onnx")
    assert "not a built-in ONNX model" in err and "squeezenet, digits_mlp" in err


def test_static_quantization_without_calibration_names_the_flag(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, conv: Path
) -> None:
    err = refused(capsys, conv, "--out", tmp_path / "q.onnx", "--held-out", tmp_path)
    assert err.startswith("lumenrt quantize: --calibration: static quantization")


def test_dynamic_quantization_without_samples_names_held_out(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    model = mlp(tmp_path / "mlp.onnx")
    assert "--held-out: needed" in refused(capsys, model, "--out", tmp_path / "q.onnx")


def test_empty_calibration_folder_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, conv: Path
) -> None:
    (tmp_path / "empty").mkdir()
    err = refused(capsys, conv, "--out", tmp_path / "q.onnx", "--calibration", tmp_path / "empty")
    assert "--calibration" in err and "no .npy files" in err and "image.npy" in err


def test_missing_calibration_folder_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, conv: Path
) -> None:
    err = refused(capsys, conv, "--out", tmp_path / "q.onnx", "--calibration", tmp_path / "absent")
    assert "--calibration" in err and "no such folder" in err


def test_file_naming_no_input_suggests_the_close_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, conv: Path
) -> None:
    calib = sample_folder(tmp_path / "calib", {"images": images(4)})
    err = refused(capsys, conv, "--out", tmp_path / "q.onnx", "--calibration", calib)
    assert "images.npy names no input" in err and "did you mean image.npy?" in err


def test_input_without_a_file_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    model = two_inputs(tmp_path / "add.onnx")
    held = sample_folder(tmp_path / "held", {"a": np.zeros((4, 4), np.float32)})
    err = refused(capsys, model, "--out", tmp_path / "q.onnx", "--held-out", held)
    assert "--held-out" in err and "no b.npy for the model's input 'b'" in err


def test_wrong_shape_is_refused_from_the_header_before_reading(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, conv: Path
) -> None:
    # the header claims 100k ImageNet-sized images, and the file holds none: only the header is read
    (tmp_path / "calib").mkdir()
    header_only_npy(tmp_path / "calib" / "image.npy", (100_000, 3, 224, 224))
    err = refused(capsys, conv, "--out", tmp_path / "q.onnx", "--calibration", tmp_path / "calib")
    assert "image.npy has shape [100000, 3, 224, 224]" in err and "[batch, 1, 8, 8]" in err


def test_wrong_dtype_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path, conv: Path) -> None:
    calib = sample_folder(tmp_path / "calib", {"image": images(4).astype(np.float64)})
    err = refused(capsys, conv, "--out", tmp_path / "q.onnx", "--calibration", calib)
    assert "image.npy holds float64" in err and "takes float32" in err


def test_sample_counts_must_agree_across_inputs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    model = two_inputs(tmp_path / "add.onnx")
    held = sample_folder(
        tmp_path / "held", {"a": np.zeros((4, 4), np.float32), "b": np.zeros((5, 4), np.float32)}
    )
    err = refused(capsys, model, "--out", tmp_path / "q.onnx", "--held-out", held)
    assert "b.npy has 5 samples but a.npy has 4" in err


def test_a_file_with_no_samples_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, conv: Path
) -> None:
    calib = sample_folder(tmp_path / "calib", {"image": images(0)})
    assert "holds no samples" in refused(capsys, conv, "--out", tmp_path / "q.onnx", "--calibration", calib)


def test_a_truncated_file_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path, conv: Path) -> None:
    (tmp_path / "calib").mkdir()
    header_only_npy(tmp_path / "calib" / "image.npy", (8, 1, 8, 8))
    err = refused(capsys, conv, "--out", tmp_path / "q.onnx", "--calibration", tmp_path / "calib")
    assert "image.npy: cannot be read" in err


def test_calibration_folder_as_held_out_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, conv: Path
) -> None:
    calib = sample_folder(tmp_path / "calib", {"image": images(8)})
    err = refused(capsys, conv, "--out", tmp_path / "q.onnx", "--calibration", calib, "--held-out", calib)
    assert "--held-out" in err and "the --calibration folder itself" in err


def test_too_few_samples_to_split_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, conv: Path
) -> None:
    calib = sample_folder(tmp_path / "calib", {"image": images(1)})
    err = refused(capsys, conv, "--out", tmp_path / "q.onnx", "--calibration", calib)
    assert "too few to hold some out" in err


def test_out_must_not_be_the_model(capsys: pytest.CaptureFixture[str], tmp_path: Path, conv: Path) -> None:
    assert "is MODEL itself" in refused(capsys, conv, "--out", conv)


def test_out_folder_must_exist(capsys: pytest.CaptureFixture[str], tmp_path: Path, conv: Path) -> None:
    assert "does not exist" in refused(capsys, conv, "--out", tmp_path / "no" / "q.onnx")


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--seconds", "0"), ("--threads", "0"), ("--calibration-samples", "0"), ("--held-out-samples", "-1")],
)
def test_numbers_out_of_range_are_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, conv: Path, flag: str, value: str
) -> None:
    err = refused(capsys, conv, "--out", tmp_path / "q.onnx", flag, value)
    assert f"{flag} {value}: must be" in err


def test_per_channel_needs_opset_13(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    old = mlp(tmp_path / "old.onnx", opset=11)
    held = sample_folder(tmp_path / "held", {"x": np.zeros((4, 16), np.float32)})
    err = refused(capsys, old, "--out", tmp_path / "q.onnx", "--held-out", held, "--per-channel")
    assert "--per-channel" in err and "opset is 11" in err


def test_unknown_output_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    model = mlp(tmp_path / "mlp.onnx")
    held = sample_folder(tmp_path / "held", {"x": np.zeros((4, 16), np.float32)})
    err = refused(capsys, model, "--out", tmp_path / "q.onnx", "--held-out", held, "--output", "probs")
    assert "--output probs: the model has no such output (it has scores)" in err
    assert not (tmp_path / "q.onnx").exists()


def test_fixed_batch_needs_whole_batches(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    model = mlp(tmp_path / "mlp.onnx", batch=4)
    held = sample_folder(tmp_path / "held", {"x": np.zeros((6, 16), np.float32)})
    err = refused(capsys, model, "--out", tmp_path / "q.onnx", "--held-out", held)
    assert "x.npy has 6 samples" in err and "4 at a time" in err


def test_help_explains_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["quantize", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for flag in (
        "--out",
        "--report",
        "--method",
        "--per-channel",
        "--reduce-range",
        "--symbolic-shapes",
        "--calibration",
        "--calibration-samples",
        "--held-out",
        "--held-out-samples",
        "--output",
        "--batch",
        "--threads",
        "--seconds",
        "builtin:NAME",
        "<input name>.npy",
    ):
        assert flag in text
