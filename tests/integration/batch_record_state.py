"""State shared between test_batching_semantics and the Python model it loads (same interpreter,
thread mode): the model blocks on GATE while a test holds it, and records, per call of ``infer``,
the first value of each row it was given (each request's rows carry the request's own number)."""

import threading

GATE = threading.Event()
GATE.set()
ENTERED = threading.Event()  # set by the model when a call is inside infer()
CALLS: list[list[int]] = []
