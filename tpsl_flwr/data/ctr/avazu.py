"""Avazu click-through data from the original ``train.csv``.

Reads the comma-separated file with its header (``id,click,hour,C1,banner_pos,
site_id,...,C21``), plain or gzip, in bounded memory, with the encoding cached
beside the file. ``id`` is dropped; ``click`` is the label; ``hour``
(``YYMMDDHH``) becomes the categorical hour of day (24 codes) under its own name
and drives the time split; every other column is a hashed categorical column
(code 0 = empty field) under its original name.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tpsl_flwr.data.ctr.formats import AVAZU
from tpsl_flwr.data.ctr.hashing import DEFAULT_HASH_BUCKETS
from tpsl_flwr.data.ctr.load import load_ctr
from tpsl_flwr.data.tabular import DatasetSplit

__all__ = ["load_avazu"]


def load_avazu(
    path: str | Path,
    *,
    rows: int | None = None,
    seed: int = 0,
    test_fraction: float = 0.2,
    split: str = "random",
    test_days: int = 1,
    hash_buckets: int | Mapping[str, int] = DEFAULT_HASH_BUCKETS,
    hash_seed: int = 0,
    cache: bool = True,
    cache_dir: str | Path | None = None,
    on_bad_rows: str = "error",
) -> DatasetSplit:
    """Load an Avazu ``train.csv``, encoded and split.

    Parameters
    ----------
    path : str or Path
        The file, optionally gzip-compressed.
    rows : int, optional
        Read only the first ``rows`` data rows (default: all).
    seed : int
        Seed of the random split.
    test_fraction : float
        Fraction held out by the random split, in ``(0, 1)``.
    split : {"random", "time"}
        ``"random"``: data row ``i`` is test iff a hash of ``(i, seed)`` falls
        below ``test_fraction`` (never label-based). ``"time"``: the last
        ``test_days`` calendar days of ``hour`` are test, the earlier days train.
    test_days : int
        Days held out by the time split (>= 1).
    hash_buckets : int or mapping of str to int
        Codes per hashed column (code 0 = missing), one number for all or by name.
    hash_seed : int
        Seed of the hashing trick.
    cache : bool
        Cache the encoded arrays and reuse them.
    cache_dir : str or Path, optional
        Where the cache lives (default ``.tpsl-cache`` beside the file).
    on_bad_rows : {"error", "skip"}
        Raise on the first malformed row, or drop malformed rows and count them.

    Returns
    -------
    DatasetSplit
        Named ``"avazu"``: no numeric column, 22 categorical columns (``hour``
        first, then ``C1``, ``banner_pos``, ..., ``C21``); ``info`` as for
        :func:`~tpsl_flwr.data.ctr.criteo.load_criteo`.

    Raises
    ------
    ConfigError
        If the file is missing, its header is not Avazu's (naming the column), a
        line is malformed (naming the line and column), it has no positive label,
        the time split finds a single day, or an argument is out of range.
    """
    return load_ctr(
        AVAZU,
        path,
        rows=rows,
        seed=seed,
        test_fraction=test_fraction,
        split=split,
        test_days=test_days,
        hash_buckets=hash_buckets,
        hash_seed=hash_seed,
        cache=cache,
        cache_dir=cache_dir,
        on_bad_rows=on_bad_rows,
    )
