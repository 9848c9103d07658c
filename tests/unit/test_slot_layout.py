"""The slot header as the request path writes it (struct, at fixed offsets) reads back the same
through the structured view ``header`` (numpy's own layout of HEADER_DTYPE), and through the
readers the engine uses: inputs, outputs of every kind (strided, empty, 0-d, bool, big-endian),
stage times, status and the error text."""

import numpy as np
import pytest

from lumenrt.engine.config import ModelConfig, TensorSpec
from lumenrt.engine.slot_layout import (
    DATA_AT,
    ERROR_MAX_BYTES,
    SlotTooSmall,
    header,
    read_answer,
    read_error,
    read_tensors,
    set_compute,
    set_dequeued,
    set_status,
    write_error,
    write_inputs,
    write_outputs,
)

OUTPUTS = {
    "strided": np.arange(12, dtype=np.float16).reshape(3, 4).T,  # not C-contiguous
    "empty": np.zeros((0, 3), np.float32),
    "scalar": np.array(2.5),
    "flags": np.array([True, False, True]),
    "wide": np.arange(5, dtype=">i4"),  # big-endian
}


def _config() -> ModelConfig:
    inputs = (TensorSpec("x", "FP32", (2, 3)), TensorSpec("ids", "INT64", (4,)))
    outputs = tuple(
        TensorSpec(name, dt, a.shape)
        for (name, a), dt in zip(OUTPUTS.items(), ("FP16", "FP32", "FP64", "BOOL", "INT32"), strict=True)
    )
    return ModelConfig(name="layout", backend="python", max_batch_size=0, inputs=inputs, outputs=outputs)


def test_what_the_request_path_writes_reads_back_the_same_every_way() -> None:
    slot = memoryview(bytearray(8192))
    slot[:] = b"\xa5" * len(slot)  # a reused slot: whatever was there before
    config = _config()
    inputs = {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "ids": np.array([7, 8, 9, 10])}
    write_inputs(slot, inputs)
    set_dequeued(slot, 111)
    set_compute(slot, 222, 333, 4)
    write_outputs(slot, OUTPUTS)
    set_status(slot, 5)

    h = header(slot)
    assert (int(h["n_inputs"]), int(h["n_outputs"]), int(h["status"]), int(h["error_bytes"])) == (2, 5, 5, 0)
    assert (int(h["dequeued_ns"]), int(h["compute_start_ns"]), int(h["compute_end_ns"])) == (111, 222, 333)
    assert int(h["batch_rows"]) == 4
    tensors = [*inputs.values(), *OUTPUTS.values()]
    for i, a in enumerate(tensors):
        assert int(h["nbytes"][i]) == a.nbytes and int(h["ndim"][i]) == a.ndim
        assert tuple(h["shape"][i, : a.ndim]) == a.shape
        assert int(h["offset"][i]) >= DATA_AT and int(h["offset"][i]) % 64 == 0
    offsets = [int(h["offset"][i]) for i in range(len(tensors))]
    assert offsets == sorted(offsets)  # the outputs after the inputs, none overlapping
    assert all(offsets[i] + tensors[i].nbytes <= offsets[i + 1] for i in range(len(tensors) - 1))

    for name, view in read_tensors(slot, config, outputs=False).items():
        np.testing.assert_array_equal(view, inputs[name])
    outs = read_tensors(slot, config, outputs=True)
    assert list(outs) == list(OUTPUTS)
    for name, view in outs.items():
        want = OUTPUTS[name]
        assert view.shape == want.shape
        np.testing.assert_array_equal(view.astype(want.dtype.newbyteorder("=")), want)
    assert read_answer(slot) == (5, 111, 222, 333, 4)
    assert read_error(slot) == ""


def test_an_error_is_cut_to_its_room_and_reads_back() -> None:
    slot = memoryview(bytearray(8192))
    write_inputs(slot, {"x": np.zeros((2, 3), np.float32)})
    write_error(slot, "model failed: " + "x" * 2000)
    assert int(header(slot)["error_bytes"]) == ERROR_MAX_BYTES
    assert read_error(slot) == ("model failed: " + "x" * 2000)[:ERROR_MAX_BYTES]


def test_outputs_too_large_for_the_slot_are_refused_before_any_is_written() -> None:
    slot = memoryview(bytearray(DATA_AT + 256))
    write_inputs(slot, {"x": np.zeros(8, np.float32)})
    with pytest.raises(SlotTooSmall, match="does not fit"):
        write_outputs(slot, {"y": np.zeros(1024, np.float32)})
    assert int(header(slot)["n_outputs"]) == 0
