"""State shared between test_engine_borrow and the Python model it loads (thread mode: same
interpreter): the test puts the caller's array in CALLER, the model records for each call whether
its input is that very memory."""

import numpy as np

CALLER: list[np.ndarray] = []
SHARED: list[bool] = []
