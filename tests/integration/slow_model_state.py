"""State shared between tests and the Python test model they load (same interpreter, thread mode):
the model blocks on GATE while a test needs it held, and records each batch's rows in CALLS."""

import threading

GATE = threading.Event()
GATE.set()
ENTERED = threading.Event()  # set by the model when a batch is inside infer()
CALLS: list[int] = []
