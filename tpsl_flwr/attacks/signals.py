"""The signals the attacks score, and the checks they share.

A non-label party receives, for each sample of a batch, its slice of the
cut-layer gradient *divided by the batch size* (the label party averages the
loss over the batch, :mod:`tpsl_flwr.privacy.perturb`). The attacker knows the batch
size, so every scorer here works in per-sample units: call
:func:`per_sample_gradients` on what a message carried first.

Every check raises :class:`~tpsl_flwr.errors.ConfigError` naming the bad
value, in the manner of ART's ``_check_params``.
"""

from __future__ import annotations

from numbers import Integral

import numpy as np
from numpy.typing import ArrayLike

from tpsl_flwr._util.checks import check_int
from tpsl_flwr.errors import ConfigError


def as_matrix(values: ArrayLike, name: str, min_rows: int = 1) -> np.ndarray:
    """``values`` as a finite float64 ``(n, d)`` matrix (1-D means ``d = 1``).

    Parameters
    ----------
    values
        Gradients or embeddings, one row per sample.
    name
        The name used in error messages.
    min_rows
        The fewest rows accepted.

    Returns
    -------
    numpy.ndarray
        A float64 ``(n, d)`` array.

    Raises
    ------
    ConfigError
        If ``values`` is not 1-D or 2-D, has too few rows, no columns, or holds
        NaN or infinity.

    Examples
    --------
    >>> as_matrix([1.0, 2.0], "gradients").shape
    (2, 1)
    """
    try:
        out = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be numeric, got {values!r}") from None
    if out.ndim == 1:
        out = out[:, None]
    if out.ndim != 2:
        raise ConfigError(f"{name} must be 1-D or 2-D (n, d), got shape {out.shape}")
    if out.shape[0] < min_rows or out.shape[1] < 1:
        raise ConfigError(
            f"{name} needs at least {min_rows} row(s) and 1 column, got shape "
            f"{out.shape}"
        )
    if not np.all(np.isfinite(out)):
        raise ConfigError(f"{name} contains NaN or infinity")
    return out


def per_sample_gradients(received: ArrayLike, batch_size: int) -> np.ndarray:
    """Undo the label party's batch averaging: ``received * batch_size``.

    Parameters
    ----------
    received
        ``(n, d)`` gradient slice as a message carried it.
    batch_size
        The size of the batch the label party averaged over (the number of
        ids of that batch in the message).

    Returns
    -------
    numpy.ndarray
        ``(n, d)`` per-sample gradients, comparable across batches of
        different sizes and with :func:`~tpsl_flwr.privacy.perturb.candidate_gradients`.

    Raises
    ------
    ConfigError
        If ``batch_size`` is not an integer >= 1 or ``received`` is malformed.

    Examples
    --------
    >>> per_sample_gradients([[0.25], [-0.5]], batch_size=4)
    array([[ 1.],
           [-2.]])
    """
    size = check_int(batch_size, "batch_size", minimum=1)
    return as_matrix(received, "received gradients") * size


def reference_vector(
    positive: int | ArrayLike, rows: np.ndarray, name: str = "positive"
) -> np.ndarray:
    """The gradient of the known positive sample: a row index or a vector.

    Parameters
    ----------
    positive
        Index of a row of ``rows`` known to have label 1, or a ``(d,)`` vector.
    rows
        ``(n, d)`` per-sample gradients or embeddings.
    name
        The name used in error messages.

    Returns
    -------
    numpy.ndarray
        A float64 ``(d,)`` vector.

    Raises
    ------
    ConfigError
        If the index is out of range or the vector's width differs from ``d``.
    """
    if isinstance(positive, Integral) and not isinstance(positive, bool):
        index = int(positive)
        if not -rows.shape[0] <= index < rows.shape[0]:
            raise ConfigError(
                f"{name} index must be in [0, {rows.shape[0]}), got {positive}"
            )
        return rows[index]
    if isinstance(positive, bool):
        raise ConfigError(f"{name} must be an index or a vector, got {positive!r}")
    vector = as_matrix(positive, name).ravel()
    if vector.shape[0] != rows.shape[1]:
        raise ConfigError(
            f"{name} vector has width {vector.shape[0]}, the rows have {rows.shape[1]}"
        )
    return vector
