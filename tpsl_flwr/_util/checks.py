"""Input checks shared by the core modules.

Every check raises :class:`~tpsl_flwr.errors.ConfigError` with the offending
value in the message, following the pattern of Flower's
``dp_fixed_clipping.py`` and dp-accounting's ``gaussian_mechanism.py``.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import numpy as np
from numpy.typing import DTypeLike

from tpsl_flwr.errors import ConfigError


def check_epsilon(epsilon: object, name: str = "epsilon") -> float:
    """Return ``epsilon`` as a float after checking it is a finite number > 0.

    Parameters
    ----------
    epsilon
        The privacy budget to check.
    name
        The name used in the error message.

    Returns
    -------
    float
        The validated value.

    Raises
    ------
    ConfigError
        If ``epsilon`` is not a real number, or is 0, negative, NaN or infinite.

    Examples
    --------
    >>> check_epsilon(1)
    1.0
    >>> check_epsilon(0)
    Traceback (most recent call last):
    ...
    tpsl_flwr.errors.ConfigError: epsilon must be > 0 and finite, got 0
    """
    return check_positive_finite(epsilon, name)


def check_sigma(sigma: object, name: str = "sigma") -> float:
    """Return ``sigma`` as a float after checking it is a finite number > 0.

    Raises
    ------
    ConfigError
        If ``sigma`` is not a real number, or is <= 0, NaN or infinite.
    """
    return check_positive_finite(sigma, name)


def check_positive_finite(value: object, name: str) -> float:
    """Return ``value`` as a float after checking it is a finite number > 0.

    Raises
    ------
    ConfigError
        If ``value`` is not a real number, or is <= 0, NaN or infinite; the
        message names ``name`` and the value.
    """
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    as_float = float(value)
    if not math.isfinite(as_float) or as_float <= 0:
        raise ConfigError(f"{name} must be > 0 and finite, got {value}")
    return as_float


def check_int(value: object, name: str, minimum: int = 1) -> int:
    """Return ``value`` as an int after checking it is an integer >= ``minimum``.

    Raises
    ------
    ConfigError
        If ``value`` is not an integer (booleans included) or is too small.

    Examples
    --------
    >>> check_int(0, "epochs")
    Traceback (most recent call last):
    ...
    tpsl_flwr.errors.ConfigError: epochs must be an integer >= 1, got 0
    """
    if isinstance(value, bool) or not isinstance(value, Integral) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_num_classes(num_classes: object) -> int:
    """Return the number of classes after checking it is an integer >= 2."""
    return check_int(num_classes, "classes", minimum=2)


def check_labels(
    labels: object, num_classes: int, dtype: DTypeLike = np.int64
) -> np.ndarray:
    """Return ``labels`` as a non-empty integer vector with values in ``[0, k)``.

    Parameters
    ----------
    labels
        Array-like of integer class labels.
    num_classes
        The number of classes ``k``.
    dtype
        The returned dtype: int64, or a narrower one that holds ``k - 1``
        (:func:`~tpsl_flwr._util.compact_ints.label_dtype`, for labels held a whole
        run). Integer input is range-checked before any conversion.

    Returns
    -------
    numpy.ndarray
        The labels as a 1-D array of ``dtype``.

    Raises
    ------
    ConfigError
        If the labels are empty, not 1-D, not integers, or outside ``[0, k)``.
    """
    array = np.asarray(labels)
    if array.ndim != 1:
        raise ConfigError(f"labels must be a 1-D array, got shape {array.shape}")
    if array.size == 0:
        raise ConfigError("labels must not be empty (got an empty batch)")
    if array.dtype.kind == "f":
        if not np.all(np.isfinite(array)) or np.any(array != np.round(array)):
            bad = array[~np.isfinite(array) | (array != np.round(array))][0]
            raise ConfigError(f"labels must be integers, got {bad}")
    elif array.dtype.kind not in "iub":
        raise ConfigError(f"labels must be integers, got dtype {array.dtype}")
    if array.dtype.kind in "iub" and 0 <= array.min() and array.max() < num_classes:
        return array.astype(dtype)  # in range: no int64 copy of every label
    as_int = array.astype(np.int64)
    out_of_range = (as_int < 0) | (as_int >= num_classes)
    if np.any(out_of_range):
        bad = as_int[out_of_range][0]
        raise ConfigError(
            f"labels must lie in [0, {num_classes}), got {bad} "
            f"({int(out_of_range.sum())} of {as_int.size} out of range)"
        )
    return as_int.astype(dtype, copy=False)


def check_sample_ids(ids: object, expected_length: int | None = None) -> np.ndarray:
    """Return sample ids as a non-empty int64 vector of non-negative values.

    Parameters
    ----------
    ids
        Array-like of integer sample ids.
    expected_length
        If given, the number of labels the ids must match.

    Raises
    ------
    ConfigError
        If the ids are empty, negative, not integers, or of the wrong length.
    """
    array = np.asarray(ids)
    if array.ndim != 1:
        raise ConfigError(f"sample ids must be a 1-D array, got shape {array.shape}")
    if array.size == 0:
        raise ConfigError("sample ids must not be empty (got an empty batch)")
    if array.dtype.kind not in "iu":
        raise ConfigError(f"sample ids must be integers, got dtype {array.dtype}")
    if expected_length is not None and array.size != expected_length:
        raise ConfigError(
            f"sample ids and labels must have the same length, "
            f"got {array.size} ids and {expected_length} labels"
        )
    if np.any(array < 0):
        raise ConfigError(f"sample ids must be >= 0, got {array[array < 0][0]}")
    return array.astype(np.int64)


PLACEMENTS: tuple[str, ...] = ("logits", "cut")
"""Where GradPerturb is applied (Yang et al., Section 4.2 vs Algorithm 3)."""


def check_placement(placement: str) -> str:
    """Return ``placement`` after checking it is one of :data:`PLACEMENTS`."""
    if placement not in PLACEMENTS:
        raise ConfigError(
            f"unknown placement {placement!r}; "
            f"valid placements: {', '.join(PLACEMENTS)}"
        )
    return placement
