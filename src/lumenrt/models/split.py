"""The train/test split both trained built-in models use: a stratified quarter held out, fixed seed."""

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

Split = tuple[
    tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]],
    tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]],
]


def held_out_split(load: Callable[..., Any], seed: int) -> Split:
    """``load`` is a scikit-learn dataset loader (``load_digits``, ``load_breast_cancer``)."""
    from sklearn.model_selection import train_test_split

    x, y = load(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x.astype(np.float32), y.astype(np.int64), test_size=0.25, random_state=seed, stratify=y
    )
    return (x_train, y_train), (x_test, y_test)
