"""Criteo Display Advertising Challenge data from the original files.

Reads ``train.txt`` (tab-separated, no header: label, ``I1..I13``, ``C1..C26``) or
the Kaggle CSV variant (header ``Id,Label,I1..I13,C1..C26``), plain or gzip
(detected from the content), in bounded memory, with the encoding cached beside
the file. Counts become ``sign(x) log(1 + |x|)`` (missing: 0) and are then
standardized with train statistics; categorical tokens are hashed into
``hash_buckets`` codes with code 0 for a missing field
(:mod:`~tpsl_flwr.data.ctr.hashing`). Columns keep their original names
(``I1``.., ``C1``..), so :func:`~tpsl_flwr.data.partition_columns` can assign them
to parties by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tpsl_flwr.data.ctr.formats import CRITEO_KAGGLE, CRITEO_TSV, CTRFormat
from tpsl_flwr.data.ctr.hashing import DEFAULT_HASH_BUCKETS
from tpsl_flwr.data.ctr.load import check_path, load_ctr
from tpsl_flwr.data.ctr.reader import first_line
from tpsl_flwr.data.tabular import DatasetSplit
from tpsl_flwr.errors import ConfigError

__all__ = ["criteo_format", "load_criteo"]

VARIANTS = ("auto", "tsv", "kaggle")
"""Accepted values of ``variant``."""


def criteo_format(path: str | Path, variant: str = "auto") -> CTRFormat:
    """The Criteo layout of a file: ``train.txt`` or the Kaggle CSV.

    Parameters
    ----------
    path : str or Path
        The file.
    variant : {"auto", "tsv", "kaggle"}
        ``"auto"`` picks the Kaggle CSV when the first line starts with ``Id,``
        and the tab-separated ``train.txt`` otherwise.

    Returns
    -------
    CTRFormat
        :data:`~tpsl_flwr.data.ctr.formats.CRITEO_TSV` or
        :data:`~tpsl_flwr.data.ctr.formats.CRITEO_KAGGLE`.

    Raises
    ------
    ConfigError
        If ``variant`` is unknown or the file is missing.
    """
    if variant not in VARIANTS:
        raise ConfigError(f"variant must be one of {list(VARIANTS)}, got {variant!r}")
    if variant == "tsv":
        return CRITEO_TSV
    if variant == "kaggle":
        return CRITEO_KAGGLE
    head = first_line(check_path(path))
    return CRITEO_KAGGLE if head.startswith("Id,") else CRITEO_TSV


def load_criteo(
    path: str | Path,
    *,
    rows: int | None = None,
    seed: int = 0,
    test_fraction: float = 0.2,
    split: str = "random",
    hash_buckets: int | Mapping[str, int] = DEFAULT_HASH_BUCKETS,
    hash_seed: int = 0,
    cache: bool = True,
    cache_dir: str | Path | None = None,
    on_bad_rows: str = "error",
    variant: str = "auto",
    missing_indicators: bool = False,
) -> DatasetSplit:
    """Load a Criteo file, encoded, split and standardized.

    Parameters
    ----------
    path : str or Path
        ``train.txt`` or the Kaggle ``train.csv``, optionally gzip-compressed.
    rows : int, optional
        Read only the first ``rows`` data rows (default: all).
    seed : int
        Seed of the random split.
    test_fraction : float
        Fraction held out for test, in ``(0, 1)``.
    split : {"random", "time"}
        ``"random"``: data row ``i`` is test iff a hash of ``(i, seed)`` falls
        below ``test_fraction`` (never label-based). ``"time"``: the last
        ``test_fraction`` of the rows in file order (Criteo's files are in time
        order).
    hash_buckets : int or mapping of str to int
        Codes per categorical column (code 0 = missing), one number for all or by
        column name.
    hash_seed : int
        Seed of the hashing trick (0: the documented default buckets).
    cache : bool
        Cache the encoded arrays (memory-mapped ``.npy``) and reuse them; the key
        covers the file's path, size and modification time and every encoding
        parameter.
    cache_dir : str or Path, optional
        Where the cache lives (default ``.tpsl-cache`` beside the file; a
        temporary folder, with a warning, if that is not writable).
    on_bad_rows : {"error", "skip"}
        Raise on the first malformed row (default), or drop malformed rows and
        count them in ``info["rows_skipped"]``.
    variant : {"auto", "tsv", "kaggle"}
        The file layout (see :func:`criteo_format`).
    missing_indicators : bool
        Also add 13 numeric 0/1 columns ``I1_missing``..``I13_missing`` after the
        counts (a missing count and a zero count both become 0 otherwise).

    Returns
    -------
    DatasetSplit
        Named ``"criteo"`` or ``"criteo-kaggle"``: 13 numeric (26 with
        ``missing_indicators``) and 26 categorical columns. ``info`` holds
        ``rows``, ``rows_read``, ``rows_skipped`` (malformed rows dropped in the
        chunks read), ``train_rows``, ``test_rows``, ``positive_rate`` (and per
        split), ``source``, ``format``, ``split``, ``seed``, ``cache_hit``,
        ``cache_path``.

    Raises
    ------
    ConfigError
        If the file is missing (naming the path), a line has the wrong number of
        fields or a field does not parse (naming the line, column and value), the
        file has no positive label, or an argument is out of range.

    Examples
    --------
    >>> import tempfile
    >>> from tpsl_flwr.testing import write_criteo
    >>> with tempfile.TemporaryDirectory() as d:
    ...     _ = write_criteo(f"{d}/train.txt", 500, seed=0)
    ...     s = load_criteo(f"{d}/train.txt", hash_buckets=1000)
    >>> s.train.numeric_names[:2], s.train.categorical.shape[1], s.info["rows"]
    (('I1', 'I2'), 26, 500)
    """
    fmt = criteo_format(path, variant)
    return load_ctr(
        fmt,
        path,
        rows=rows,
        seed=seed,
        test_fraction=test_fraction,
        split=split,
        test_days=1,
        hash_buckets=hash_buckets,
        hash_seed=hash_seed,
        cache=cache,
        cache_dir=cache_dir,
        on_bad_rows=on_bad_rows,
        missing_indicators=missing_indicators,
    )
