"""A GPU instance's staging and stream schedule (engine/gpu/staging.py, pipeline.py) on the fake
device of tests/fake_device.py: buffers allocated once, the order of each batch's copies and
compute, the next batch's copy in beside this one's compute, host waits on its own batches'
events only, failures confined to their batch, CUDA graphs chosen by batch size."""

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from lumenrt.engine.config import ConfigError, ModelConfig, model_config_from_dict
from lumenrt.engine.gpu.device import DeviceError
from lumenrt.engine.gpu.pipeline import Pipeline, Streams, graph_sizes
from lumenrt.engine.gpu.staging import SETS, StagingPlan
from tests.fake_device import WAIT_GUARD_S, FakeDevice, Issued, fake_program

ROW = 3


def gpu_config(**extra: Any) -> ModelConfig:
    raw = {
        "backend": "pytorch",
        "max_batch_size": 4,
        "input": [{"name": "x", "datatype": "FP32", "dims": [ROW]}],
        "output": [{"name": "y", "datatype": "FP32", "dims": [ROW]}],
        "instance_group": [{"kind": "KIND_GPU"}],
        **extra,
    }
    return model_config_from_dict(raw, "m/config.yaml", "m")


@pytest.fixture
def device() -> Iterator[FakeDevice]:
    dev = FakeDevice()
    yield dev
    dev.close()


def make_pipeline(device: FakeDevice, config: ModelConfig, program: Any = None) -> Pipeline:
    streams = Streams.create(device, config.gpu.copy_streams)
    program = program or fake_program(lambda x: x * 2)
    return Pipeline(device, streams, StagingPlan.for_config(config), program, config.gpu, graph_sizes(config))


def run_batch(pipeline: Pipeline, index: int, x: np.ndarray) -> np.ndarray:
    s = pipeline.sets[index % SETS]
    s.host_in["x"].array[: len(x)] = x
    pipeline.launch(s, len(x))
    pipeline.wait(s)
    return s.host_out["y"].array[: len(x)].copy()


def happens_before(issued: list[Issued]) -> dict[int, set[int]]:
    """seq -> the seqs of the operations ordered after it: stream order, and record -> the waits
    for that record (the device's only ordering rules)."""
    after: dict[int, set[int]] = {op.seq: set() for op in issued}
    last: dict[str, int] = {}
    records = {}
    for op in issued:
        if op.stream in last:
            after[last[op.stream]].add(op.seq)
        last[op.stream] = op.seq
        if op.kind == "record":
            records[(id(op.event), op.generation)] = op.seq
        if op.kind == "wait":
            after[records[(id(op.event), op.generation)]].add(op.seq)
    closure: dict[int, set[int]] = {}
    for seq in sorted(after, reverse=True):  # edges only go forward in issue order
        closure[seq] = set(after[seq]).union(*(closure[n] for n in after[seq]))
    return closure


def op(issued: list[Issued], kind: str, tag: int) -> int:
    (seq,) = [o.seq for o in issued if o.kind == kind and o.tag == tag]
    return seq


def test_staging_is_allocated_once_at_load_and_never_per_batch(device: FakeDevice) -> None:
    pipeline = make_pipeline(device, gpu_config())
    at_load = dict(device.counts)
    # per set: one host and one device buffer per input and per output, six events; three streams
    assert at_load == {"host_buffer": 2 * SETS, "device_buffer": 2 * SETS, "event": 6 * SETS, "stream": 3}
    assert all(b.pinned for s in pipeline.sets for b in (*s.host_in.values(), *s.host_out.values()))
    assert pipeline.sets[0].host_in["x"].array.shape == (4, ROW)  # max_batch_size rows
    for i in range(20):
        x = np.full((1 + i % 4, ROW), i, np.float32)
        np.testing.assert_array_equal(run_batch(pipeline, i, x), x * 2)
    assert {k: v for k, v in device.counts.items() if k in at_load} == at_load  # nothing more allocated


def test_pageable_staging_when_pinning_is_turned_off(device: FakeDevice) -> None:
    config = gpu_config(optimization={"output_pinned_memory": {"enable": False}})
    pipeline = make_pipeline(device, config)
    assert all(b.pinned for s in pipeline.sets for b in s.host_in.values())
    assert not any(b.pinned for s in pipeline.sets for b in s.host_out.values())


def test_schedule_orders_each_batch_and_frees_the_next_copy_from_this_compute(device: FakeDevice) -> None:
    pipeline = make_pipeline(device, gpu_config())
    x = np.ones((2, ROW), np.float32)
    for tag in (0, 1):  # two batches in flight, one per set
        device.tag = tag
        pipeline.sets[tag].host_in["x"].array[:2] = x
        pipeline.launch(pipeline.sets[tag], 2)
    device.tag = None
    pipeline.wait(pipeline.sets[0])
    device.tag = 2  # set 0 again, only after its batch was waited for
    pipeline.launch(pipeline.sets[0], 2)
    device.tag = None
    pipeline.wait(pipeline.sets[1])
    pipeline.wait(pipeline.sets[0])
    issued, hb = device.issued, happens_before(device.issued)
    for tag in (0, 1, 2):
        copy_in, compute, copy_out = (
            op(issued, k, tag) for k in ("copy_to_device", "launch", "copy_to_host")
        )
        assert compute in hb[copy_in] and copy_out in hb[compute]  # each batch in order
    assert op(issued, "copy_to_device", 1) not in hb[op(issued, "launch", 0)]  # may run beside it
    assert op(issued, "launch", 1) in hb[op(issued, "launch", 0)]  # one compute stream: in turn
    # the host waited for batch 0's own event before refilling its set, and never for the device
    (batch0_waited,) = [seq for seq, tag in device.host_waits if tag == 0]
    assert batch0_waited < min(o.seq for o in issued if o.tag == 2)
    assert [tag for _, tag in device.host_waits] == [0, 1, 2]
    assert device.counts["synchronize"] == device.counts["synchronize_stream"] == 0


def test_next_batch_copies_in_while_this_one_computes(device: FakeDevice) -> None:
    overlapped: list[bool] = []
    first = threading.Event()

    def slow_first(x: np.ndarray) -> np.ndarray:
        if not first.is_set():  # batch 0 computes until batch 1's copy in has started
            first.set()
            overlapped.append(device.when_started("copy_to_device", 1).wait(WAIT_GUARD_S))
        return x * 2

    pipeline = make_pipeline(device, gpu_config(), fake_program(slow_first))
    for tag in (0, 1):
        device.tag = tag
        pipeline.launch(pipeline.sets[tag], 1)
    pipeline.wait(pipeline.sets[0])
    pipeline.wait(pipeline.sets[1])
    assert overlapped == [True]
    (compute0,) = [r for r in device.ran if r.kind == "launch" and r.tag == 0]
    (copy1,) = [r for r in device.ran if r.kind == "copy_to_device" and r.tag == 1]
    assert copy1.start < compute0.end


def test_one_stream_serializes_copies_and_compute(device: FakeDevice) -> None:
    pipeline = make_pipeline(device, gpu_config(optimization={"cuda": {"copy_streams": False}}))
    assert device.counts["stream"] == 1
    for tag in (0, 1):
        device.tag = tag
        pipeline.launch(pipeline.sets[tag], 1)
    pipeline.wait(pipeline.sets[1])
    hb = happens_before(device.issued)
    assert op(device.issued, "copy_to_device", 1) in hb[op(device.issued, "launch", 0)]
    assert not [o for o in device.issued if o.kind == "wait"]  # one stream: no cross-stream waits


def test_a_failed_batch_raises_at_its_own_event_and_the_next_one_runs(device: FakeDevice) -> None:
    def fails_on_negative(x: np.ndarray) -> np.ndarray:
        if (x < 0).any():
            raise RuntimeError("illegal value")  # a kernel that fails, on the stream
        return x * 2

    pipeline = make_pipeline(device, gpu_config(), fake_program(fails_on_negative))
    bad, good = pipeline.sets
    bad.host_in["x"].array[:1] = -1
    pipeline.launch(bad, 1)
    good.host_in["x"].array[:1] = 5
    pipeline.launch(good, 1)
    with pytest.raises(DeviceError, match="illegal value"):
        pipeline.wait(bad)
    pipeline.wait(good)
    assert good.host_out["y"].array[0, 0] == 10
    np.testing.assert_array_equal(
        run_batch(pipeline, 0, np.full((2, ROW), 3, np.float32)), np.full((2, ROW), 6)
    )


def test_a_refused_launch_settles_its_set_for_reuse(device: FakeDevice) -> None:
    pipeline = make_pipeline(device, gpu_config())
    device.refuse_next_launch(MemoryError("CUDA out of memory"))
    s = pipeline.sets[0]
    with pytest.raises(MemoryError):
        pipeline.launch(s, 2)
    pipeline.settle(s)
    x = np.full((2, ROW), 7, np.float32)
    np.testing.assert_array_equal(run_batch(pipeline, 0, x), x * 2)


def test_graphs_are_captured_per_set_and_size_and_the_smallest_that_fits_runs(device: FakeDevice) -> None:
    config = gpu_config(
        dynamic_batching={"preferred_batch_size": [2, 4]}, optimization={"cuda": {"graphs": True}}
    )
    program = fake_program(lambda x: x + 1)
    pipeline = make_pipeline(device, config, program)
    assert device.counts["capture"] == SETS * 2
    x = np.full((1, ROW), 4, np.float32)
    np.testing.assert_array_equal(run_batch(pipeline, 0, x), x + 1)  # graph of 2, one row used
    np.testing.assert_array_equal(run_batch(pipeline, 1, np.ones((3, ROW), np.float32)), np.full((3, ROW), 2))
    assert device.counts["replay"] == 2 and device.counts["capture"] == SETS * 2
    assert graph_sizes(gpu_config(optimization={"cuda": {"graphs": True}})) == (4,)  # max_batch_size
    assert graph_sizes(gpu_config()) == ()


def test_staging_needs_fixed_numeric_shapes() -> None:
    with pytest.raises(ConfigError, match=r"inputs\[0\]\.dims\[1\]: a GPU instance needs fixed dims"):
        StagingPlan.for_config(gpu_config(input=[{"name": "x", "datatype": "FP32", "dims": [3, -1]}]))
    with pytest.raises(ConfigError, match=r"outputs\[0\]\.datatype: BYTES"):
        StagingPlan.for_config(gpu_config(output=[{"name": "y", "datatype": "BYTES", "dims": [1]}]))


def test_a_model_without_a_batch_dimension_stages_one_row(device: FakeDevice) -> None:
    config = gpu_config(max_batch_size=0)
    pipeline = make_pipeline(device, config)
    assert pipeline.sets[0].host_in["x"].array.shape == (1, ROW)
    np.testing.assert_array_equal(run_batch(pipeline, 0, np.ones((1, ROW), np.float32)), np.full((1, ROW), 2))
