"""Sample sources for ``lumenrt quantize``: folders read lazily and within limits, splits that keep
calibration and held-out samples apart, the calibration reader, and the built-in models' data."""

from pathlib import Path

import numpy as np
import pytest

from lumenrt.models import squeezenet
from lumenrt.models.builtin import builtin_calibration, builtin_held_out
from lumenrt.quantize.calibration import SampleReader, Samples, check_shapes, read_folder, split
from lumenrt.quantize.errors import UsageError
from lumenrt.quantize.model_source import open_model
from tests.quantize_models import convnet, images, sample_folder, two_inputs


def test_folder_is_memory_mapped_and_limited(tmp_path: Path) -> None:
    model = open_model(str(convnet(tmp_path / "conv.onnx")))
    folder = sample_folder(tmp_path / "calib", {"image": images(10)})
    samples = read_folder(folder, model.inputs, "--calibration", limit=6)
    assert samples.count == 6
    assert isinstance(samples.arrays["image"], np.memmap)  # nothing read until a feed is made
    np.testing.assert_array_equal(samples.arrays["image"], images(10)[:6])


def test_folder_with_several_inputs_keeps_them_by_name(tmp_path: Path) -> None:
    model = open_model(str(two_inputs(tmp_path / "add.onnx")))
    a, b = np.ones((3, 4), np.float32), np.full((3, 4), 2, np.float32)
    samples = read_folder(sample_folder(tmp_path / "s", {"a": a, "b": b}), model.inputs, "--held-out", None)
    feeds = list(samples.batches(2))
    assert [f["a"].shape[0] for f in feeds] == [2, 1]
    np.testing.assert_array_equal(np.concatenate([f["b"] for f in feeds]), b)


def test_split_holds_out_the_last_quarter_and_never_overlaps(tmp_path: Path) -> None:
    data = images(8)
    samples = Samples({"image": data}, "calib", labels=np.arange(8))
    calibration, held_out = split(samples, fixed_batch=None)
    assert (calibration.count, held_out.count) == (6, 2)
    np.testing.assert_array_equal(held_out.arrays["image"], data[6:])
    assert held_out.labels is not None and list(held_out.labels) == [6, 7]


def test_split_keeps_whole_fixed_batches() -> None:
    samples = Samples({"image": images(12)}, "calib")
    calibration, held_out = split(samples, fixed_batch=4)
    assert (calibration.count, held_out.count) == (8, 4)


def test_split_refuses_what_cannot_be_split() -> None:
    with pytest.raises(UsageError, match="too few"):
        split(Samples({"image": images(1)}, "calib"), fixed_batch=None)


def test_reader_feeds_every_sample_once_then_none() -> None:
    data = images(5)
    reader = SampleReader(Samples({"image": data}, "calib"), batch=2)
    feeds = []
    while (feed := reader.get_next()) is not None:
        feeds.append(feed["image"])
    assert [len(f) for f in feeds] == [2, 2, 1]
    assert all(f.flags.c_contiguous for f in feeds)
    np.testing.assert_array_equal(np.concatenate(feeds), data)


def test_named_dimensions_accept_any_size_and_fixed_ones_must_match(tmp_path: Path) -> None:
    model = open_model(str(convnet(tmp_path / "conv.onnx")))  # [batch, 1, 8, 8]
    ok = check_shapes({"image": (3, 1, 8, 8)}, {"image": np.dtype(np.float32)}, model.inputs, "here", str)
    assert ok == 3
    with pytest.raises(UsageError, match=r"shape \[3, 1, 8, 9\]"):
        check_shapes({"image": (3, 1, 8, 9)}, {"image": np.dtype(np.float32)}, model.inputs, "here", str)
    with pytest.raises(UsageError, match=r"shape \[3, 8, 8\]"):  # a rank short
        check_shapes({"image": (3, 8, 8)}, {"image": np.dtype(np.float32)}, model.inputs, "here", str)


def test_builtin_squeezenet_calibrates_on_other_images_than_it_holds_out() -> None:
    calibration = builtin_calibration("squeezenet", 4)[squeezenet.INPUT_NAME]
    held_out, labels = builtin_held_out("squeezenet", 4)
    assert labels is None
    assert calibration.shape == held_out[squeezenet.INPUT_NAME].shape == (4, *squeezenet.IMAGE_SHAPE)
    assert not np.array_equal(calibration, held_out[squeezenet.INPUT_NAME])
    np.testing.assert_array_equal(held_out[squeezenet.INPUT_NAME], squeezenet.example_images(4))


def test_builtin_digits_hold_out_the_test_split_with_labels() -> None:
    held_out, labels = builtin_held_out("digits_mlp")
    calibration = builtin_calibration("digits_mlp", 64)["input"]
    assert labels is not None and len(labels) == len(held_out["input"]) == 450  # a quarter of 1,797
    assert calibration.shape == (64, 64) and calibration.dtype == np.float32


def test_builtin_without_data_is_refused() -> None:
    with pytest.raises(KeyError, match="tabular_xgb"):
        builtin_calibration("tabular_xgb", 4)
