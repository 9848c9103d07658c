"""State shared between tests and the Python test model they load (same interpreter, thread mode):
the model blocks on GATE while a test needs it held, and records each batch's rows in CALLS."""

import threading
from pathlib import Path

GATE = threading.Event()
GATE.set()
ENTERED = threading.Event()  # set by the model when a batch is inside infer()
CALLS: list[int] = []

# the ``slow`` Python model: y = 2x, held on GATE (one worker)
SLOW_MODEL = """
from tests.integration.slow_model_state import ENTERED, GATE


class Slow:
    def load(self):
        pass

    def infer(self, inputs):
        ENTERED.set()
        GATE.wait(30)
        return {"y": inputs["x"] * 2}
"""


def write_slow_model(root: Path) -> None:
    """The ``slow`` model into the repository at ``root``."""
    (root / "slow" / "1").mkdir(parents=True)
    (root / "slow" / "1" / "model.py").write_text(SLOW_MODEL)
    (root / "slow" / "config.yaml").write_text(
        "backend: python\nmax_batch_size: 0\n"
        "input:\n  - {name: x, datatype: FP32, dims: [2]}\noutput:\n  - {name: y, datatype: FP32, dims: [2]}\n"
        "instance_group: {count: 1}\n"
    )
