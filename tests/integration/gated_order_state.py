"""State shared between the scheduling tests and the Python model they load (same interpreter,
thread mode): the model blocks on GATE while a test holds it, and records the first value of each
row it runs in ORDER, so a test sees which requests ran and in what order."""

import threading

GATE = threading.Event()
GATE.set()
ENTERED = threading.Event()  # set by the model when a batch is inside infer()
ORDER: list[int] = []
