"""State shared between tests/integration/test_thread_worker_death.py and the Python test model it
loads (same interpreter, thread mode): the model holds each batch on GATE while a test needs it
held, records each batch's first column in BATCHES, and a batch with a negative value makes it
call ``sys.exit`` (SystemExit escapes the worker's per-batch ``except Exception``: its thread dies).
Loads after the first block on RELOAD_GATE (announced by RELOADING), and fail while FAIL_LOADS > 0."""

import threading
from pathlib import Path

GATE = threading.Event()
ENTERED = threading.Event()  # set by the model when a batch is inside infer()
BATCHES: list[list[float]] = []  # per batch run: x[:, 0]
LOADS: list[int] = []  # one entry per load() call
RELOADING = threading.Event()  # a load after the first has begun (a replacement)
RELOAD_GATE = threading.Event()  # a replacement's load waits here
FAIL_LOADS = [0]  # loads after the first still to fail


def reset() -> None:
    GATE.set()
    ENTERED.clear()
    BATCHES.clear()
    LOADS.clear()
    RELOADING.clear()
    RELOAD_GATE.set()
    FAIL_LOADS[0] = 0


def release() -> None:
    """Let every held call go (teardown: no thread stays blocked)."""
    GATE.set()
    RELOAD_GATE.set()


MORTAL_MODEL = """
import sys

from tests.integration import worker_death_state as state


class Mortal:
    def load(self):
        state.LOADS.append(1)
        if len(state.LOADS) > 1:
            state.RELOADING.set()
            state.RELOAD_GATE.wait(60)
            if state.FAIL_LOADS[0] > 0:
                state.FAIL_LOADS[0] -= 1
                raise RuntimeError("injected: the replacement cannot load")

    def infer(self, inputs):
        x = inputs["x"]
        state.ENTERED.set()
        state.GATE.wait(60)
        state.BATCHES.append([float(v) for v in x[:, 0]])
        if (x < 0).any():
            sys.exit("the model called sys.exit")
        return {"y": x * 2}
"""


def write_mortal_model(root: Path, name: str = "mortal") -> None:
    """One instance, batches of up to 4 rows formed from what is queued (no delay)."""
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(MORTAL_MODEL)
    (root / name / "config.yaml").write_text(
        "backend: python\nmax_batch_size: 4\n"
        "dynamic_batching: {max_queue_delay_us: 0, max_queue_size: 16}\n"
        "input:\n  - {name: x, datatype: FP32, dims: [2]}\n"
        "output:\n  - {name: y, datatype: FP32, dims: [2]}\n"
        "instance_group: {count: 1}\n"
    )
