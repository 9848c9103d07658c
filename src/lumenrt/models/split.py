"""The train/test split both trained built-in models use: a stratified quarter held out, fixed seed.

Made once per loader and seed (loading and splitting the dataset takes ~30 ms, once per
``builtin_examples`` call before), and kept read-only: the functions that hand rows to callers
(models/builtin.py) give copies."""

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

Split = tuple[
    tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]],
    tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]],
]


@functools.cache
def held_out_split(load: Callable[..., Any], seed: int) -> Split:
    """``load`` is a scikit-learn dataset loader (``load_digits``, ``load_breast_cancer``). The
    arrays are read-only (see the top)."""
    from sklearn.model_selection import train_test_split

    x, y = load(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x.astype(np.float32), y.astype(np.int64), test_size=0.25, random_state=seed, stratify=y
    )
    for array in (x_train, x_test, y_train, y_test):
        array.flags.writeable = False
    return (x_train, y_train), (x_test, y_test)
