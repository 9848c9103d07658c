"""The stream schedule of one GPU instance: consecutive batches overlap on the device.

Three streams (``optimization.cuda.copy_streams``, on by default): copy in, compute, copy out.
One batch, issued at once by ``launch`` and never waited for there:

    copy-in stream    record(copy_in_start)  H2D(host_in -> dev_in)  record(copy_in_end)
    compute stream    wait(copy_in_end)  record(compute_start)  model(dev_in -> dev_out)  record(compute_end)
    copy-out stream   wait(compute_end)  record(copy_out_start)  D2H(dev_out -> host_out)  record(copy_out_end)

With batch N computing, batch N+1's copy in (its own staging set) has nothing to wait for on its
stream, so it runs beside N's compute, and N-1's copy out beside both: the copy engines and the
SMs work at once. With ``copy_streams: false`` all three rows are one stream (no overlap; the
benchmark's baseline).

Invariants
  1. The host waits only for events of its own batches: ``wait`` synchronizes one set's
     ``copy_out_end`` (and ``settle`` that set's own events after a failed launch). Nothing here
     synchronizes the device or a stream on the request path (``close`` and graph capture at load
     do).
  2. A staging set is reused only after the host has waited for its last batch's
     ``copy_out_end``, which follows, through the events above, every copy and kernel of that
     batch: no work still reads or writes a buffer the host refills (serving.py keeps this).
  3. Nothing is allocated per batch on the device or in pinned memory: streams, sets, events and
     graphs are made in ``__init__`` (tests count them on the FakeDevice).
  4. CUDA graphs (``optimization.cuda.graphs``) are captured at load, per set, for each of the
     model's preferred batch sizes (``dynamic_batching.preferred_batch_size``; max_batch_size when
     none is listed); a batch runs the smallest graph that holds its rows (the rows past its own
     are the set's previous contents: computed and never copied out, so only for models whose
     rows do not depend on each other, which is every model a batcher may batch), else eagerly.
  5. Direct copies (``optimization.cuda.direct_copies``): a batch's pieces are read by the device
     after ``launch`` returns, so the memory they lie in (the requests' arena slots) stays
     unchanged until the host has waited for the batch's ``copy_out_end``: serving.py answers,
     and so frees, a batch's requests only after that wait.
"""

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from lumenrt.engine.config import GpuOptions, ModelConfig
from lumenrt.engine.gpu.device import Array, Device, DeviceError, DeviceProgram
from lumenrt.engine.gpu.staging import StagingPlan, StagingSet, allocate

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Streams:
    copy_in: object
    compute: object
    copy_out: object

    @classmethod
    def create(cls, device: Device, copy_streams: bool) -> "Streams":
        compute = device.new_stream()
        if not copy_streams:
            return cls(compute, compute, compute)
        return cls(device.new_stream(), compute, device.new_stream())


@dataclass(frozen=True, slots=True)
class DeviceTimes:
    """One batch's stages, in device time (its events)."""

    copy_in_ns: int
    compute_ns: int
    copy_out_ns: int


def graph_sizes(config: ModelConfig) -> tuple[int, ...]:
    """The batch sizes CUDA graphs are captured for (invariant 4)."""
    if not config.gpu.graphs:
        return ()
    db = config.dynamic_batching
    preferred = db.preferred_batch_size if db is not None else ()
    return tuple(sorted(preferred)) or (max(config.max_batch_size, 1),)


class Pipeline:
    def __init__(
        self,
        device: Device,
        streams: Streams,
        plan: StagingPlan,
        program: DeviceProgram,
        options: GpuOptions,
        graph_rows: tuple[int, ...] = (),
    ) -> None:
        self.device, self.streams, self.plan, self.program = device, streams, plan, program
        self.sets = allocate(device, plan, options)
        self._graph_rows = graph_rows
        for s in self.sets:  # invariant 4: load time only
            for rows in graph_rows:
                s.graphs[rows] = device.capture(streams.compute, self._eager(s, rows))

    def _eager(self, s: StagingSet, rows: int) -> Callable[[], None]:
        batched = self.plan.batched
        return partial(
            self.program.run,
            s.device_views(s.dev_in, rows, batched),
            s.device_views(s.dev_out, rows, batched),
        )

    def _work(self, s: StagingSet, rows: int) -> Callable[[], None]:
        for size in self._graph_rows:  # ascending: the smallest graph that holds the batch
            if size >= rows:
                return s.graphs[size]
        return self._eager(s, rows)

    def launch(self, s: StagingSet, rows: int, pieces: Sequence[tuple[str, int, Array]] = ()) -> None:
        """Issue the batch whose inputs the host has gathered into ``s.host_in`` (see the top), or,
        with ``pieces`` (input name, first row, rows), whose inputs are copied to the device from
        where they lie, each piece at its row (invariant 5). Raises only what issuing raised (the
        set must then be ``settle``d)."""
        dev, st = self.device, self.streams
        s.rows = rows
        dev.record(s.copy_in_start, st.copy_in)
        if pieces:
            for name, row, array in pieces:
                dev.copy_rows_to_device(s.dev_in[name], row, array, st.copy_in)
        else:
            for name, host in s.host_in.items():
                dev.copy_to_device(s.dev_in[name], host, rows, st.copy_in)
        dev.record(s.copy_in_end, st.copy_in)
        if st.compute is not st.copy_in:
            dev.wait_event(st.compute, s.copy_in_end)
        dev.record(s.compute_start, st.compute)
        dev.launch(st.compute, self._work(s, rows))
        dev.record(s.compute_end, st.compute)
        if st.copy_out is not st.compute:
            dev.wait_event(st.copy_out, s.compute_end)
        dev.record(s.copy_out_start, st.copy_out)
        for name, host in s.host_out.items():
            dev.copy_to_host(host, s.dev_out[name], rows, st.copy_out)
        dev.record(s.copy_out_end, st.copy_out)

    def wait(self, s: StagingSet) -> DeviceTimes:
        """The host waits for the set's batch (its ``copy_out_end`` only: invariant 1); its
        outputs are then in ``s.host_out``. DeviceError if the device failed the batch."""
        dev = self.device
        dev.synchronize_event(s.copy_out_end)
        return DeviceTimes(
            dev.elapsed_ns(s.copy_in_start, s.copy_in_end),
            dev.elapsed_ns(s.compute_start, s.compute_end),
            dev.elapsed_ns(s.copy_out_start, s.copy_out_end),
        )

    def settle(self, s: StagingSet) -> None:
        """After ``launch`` raised or the device failed the set's batch: wait until whatever was
        issued on the set is done, so that the set (and the memory direct copies read) can be
        reused (invariant 2). Never raises: a device that fails here fails the next batch too."""
        dev, st = self.device, self.streams
        try:
            dev.record(s.copy_out_end, st.copy_in)
            dev.record(s.compute_end, st.compute)
            dev.synchronize_event(s.copy_out_end)
            dev.synchronize_event(s.compute_end)
        except Exception:  # a poisoned context fails the records too: the batch is failed anyway
            pass

    def close(self) -> None:
        """Load or close time: let the streams finish, close the program, drop the buffers."""
        st = self.streams
        try:
            for stream in {id(x): x for x in (st.copy_in, st.compute, st.copy_out)}.values():
                self.device.synchronize_stream(stream)
        except DeviceError as exc:  # a poisoned context: every batch was answered already; close anyway
            logger.warning("%s: closing after a device failure: %s", self.device.name, exc)
        finally:
            self.program.close()
            self.sets = []
