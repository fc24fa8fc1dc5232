"""Train/test membership as a function of the record id alone.

Every record has a stable **record id**: its 0-based row number in the source (the
data row of a file, or the row of the generated or bundled table before any
subsample). Which split a record belongs to never looks at its label: a split that
did (a stratified one) lets anyone who sees the membership, e.g. a non-label
party, recover labels from it.

* ``"random"``: record ``i`` is a test record iff ``u(i) < test_fraction``, with
  ``u(i)`` a uniform number in ``[0, 1)`` hashed from ``(i, seed)``:

      key  = splitmix64_mix((seed * GOLDEN + DOMAIN) mod 2**64)
      z    = splitmix64_mix((key + (i + 1) * GOLDEN) mod 2**64)
      u(i) = (z >> 11) * 2**-53

  i.e. the ``i``-th output of a SplitMix64 generator seeded with a mixed
  ``seed`` (Steele, Lea and Flood, "Fast splittable pseudorandom number
  generators", OOPSLA 2014), ``GOLDEN = 0x9E3779B97F4A7C15``. It is the same on
  every machine and in any language, needs no state, and a record keeps its
  split when rows are added or removed elsewhere.
* ``"time"``: the last records in time order are test (see
  :func:`tail_is_test` and :func:`last_days_is_test`).
"""

from __future__ import annotations

import numpy as np

from tpsl_flwr._util.compact_ints import chunks, true_positions
from tpsl_flwr.errors import ConfigError

__all__ = [
    "check_fraction",
    "hash_is_test",
    "hash_uniform",
    "last_days_is_test",
    "split_positions",
    "tail_is_test",
]

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_DOMAIN = 0x7470736C2D73706C
"""ASCII ``"tpsl-spl"``: keeps these streams apart from other uses of the seed."""


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's output function on uint64 values (a bijection)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def hash_uniform(record_ids: np.ndarray, seed: int) -> np.ndarray:
    """Uniform numbers in ``[0, 1)`` hashed from ``(record id, seed)``.

    Parameters
    ----------
    record_ids : np.ndarray
        ``(n,)`` non-negative integer record ids.
    seed : int
        The public split seed (any int; taken modulo ``2**64``).

    Returns
    -------
    np.ndarray
        ``(n,)`` float64 values, multiples of ``2**-53``.

    Examples
    --------
    >>> hash_uniform(np.array([0, 1, 2]), seed=0).round(6).tolist()
    [0.158012, 0.789194, 0.374118]
    """
    given = np.asarray(record_ids)
    ids = given.reshape(-1)
    key = _mix(np.array([(int(seed) * _GOLDEN + _DOMAIN) & _MASK], dtype=np.uint64))
    out = np.empty(ids.shape, dtype=np.float64)
    for part in chunks(ids.size):  # bounded temporaries at any row count
        z = _mix(
            key + (ids[part].astype(np.uint64) + np.uint64(1)) * np.uint64(_GOLDEN)
        )
        out[part] = (z >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return out.reshape(given.shape)


def hash_is_test(
    record_ids: np.ndarray, *, seed: int, test_fraction: float
) -> np.ndarray:
    """Random split: whether each record is a test record.

    Each record is independently a test record with probability
    ``test_fraction``, decided by its id and ``seed`` only (never by a label).

    Parameters
    ----------
    record_ids : np.ndarray
        ``(n,)`` record ids.
    seed : int
        Public split seed.
    test_fraction : float
        Probability of a record being held out, in ``(0, 1)``.

    Returns
    -------
    np.ndarray
        ``(n,)`` bool.

    Raises
    ------
    ConfigError
        If ``test_fraction`` is not in ``(0, 1)``.

    Examples
    --------
    >>> hash_is_test(np.arange(6), seed=0, test_fraction=0.5).tolist()
    [True, False, True, False, True, False]
    """
    check_fraction(test_fraction)
    ids = np.asarray(record_ids)
    out = np.empty(ids.shape, dtype=bool)
    for part in chunks(ids.size):
        out[part] = hash_uniform(ids[part], seed) < float(test_fraction)
    return out


def tail_is_test(n: int, test_fraction: float) -> np.ndarray:
    """Time split without a time column: the last rows in file order are test.

    Parameters
    ----------
    n : int
        Number of records (in file order, which is time order).
    test_fraction : float
        Fraction held out, in ``(0, 1)``: ``round(test_fraction * n)`` rows, at
        least 1 and at most ``n - 1``.

    Returns
    -------
    np.ndarray
        ``(n,)`` bool.

    Examples
    --------
    >>> tail_is_test(5, 0.4).tolist()
    [False, False, False, True, True]
    """
    check_fraction(test_fraction)
    n_test = min(max(round(float(test_fraction) * n), 1), n - 1)
    is_test = np.zeros(n, dtype=bool)
    is_test[n - n_test :] = True
    return is_test


def last_days_is_test(hours: np.ndarray, test_days: int, source: str) -> np.ndarray:
    """Time split on a ``YYMMDDHH`` column: the last ``test_days`` days are test.

    Parameters
    ----------
    hours : np.ndarray
        ``(n,)`` integer ``YYMMDDHH`` values (a feature column, not a label).
    test_days : int
        Calendar days held out (>= 1).
    source : str
        Named in the error message.

    Returns
    -------
    np.ndarray
        ``(n,)`` bool.

    Raises
    ------
    ConfigError
        If the records cover no more than ``test_days`` days.
    """
    days = np.asarray(hours) // 100
    unique = np.unique(days)
    if unique.size <= test_days:
        raise ConfigError(
            f"{source}: the time split holds out the last {test_days} day(s), but "
            f"the rows read cover {unique.size} day(s) ({unique[0]}..{unique[-1]}, "
            f"YYMMDD); read more rows or use split='random'"
        )
    return np.asarray(days >= unique[-test_days])


def split_positions(
    is_test: np.ndarray, what: str, test_fraction: float
) -> tuple[np.ndarray, np.ndarray]:
    """Train and test positions of a membership mask; both must be non-empty.

    Parameters
    ----------
    is_test : np.ndarray
        ``(n,)`` bool membership.
    what : str
        Describes the split in the error message.
    test_fraction : float
        Named in the error message.

    Returns
    -------
    train_pos, test_pos : np.ndarray
        Increasing positions (int32 below 2**31 rows,
        :func:`~tpsl_flwr._util.compact_ints.true_positions`).

    Raises
    ------
    ConfigError
        If train or test is empty.
    """
    train_pos = true_positions(~is_test)
    test_pos = true_positions(is_test)
    if train_pos.size == 0 or test_pos.size == 0:
        raise ConfigError(
            f"{is_test.size} rows are too few to split ({what}, "
            f"test_fraction={test_fraction}): train {train_pos.size}, "
            f"test {test_pos.size}"
        )
    return train_pos, test_pos


def check_fraction(test_fraction: float) -> None:
    """Raise unless ``test_fraction`` is a number strictly between 0 and 1.

    Raises
    ------
    ConfigError
        Naming the value.
    """
    ok = isinstance(test_fraction, int | float | np.floating) and not isinstance(
        test_fraction, bool
    )
    if not ok or not 0.0 < float(test_fraction) < 1.0:
        raise ConfigError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
