"""Write synthetic files in the exact Criteo and Avazu formats, at any size.

Tests and benchmarks run the real loader path on these files; no real Criteo or
Avazu row is ever stored. The Criteo generator is calibrated to the shape of the
Display Advertising Challenge data (per-column rates of missing values and zeros,
count magnitudes, category counts and Zipf-like token frequencies, from the
published statistics of its 45.8M-row training file), scaled down where a column's
vocabulary exceeds what a file of ``rows`` rows could show.

Labels follow a known logit ``f(x) + b``: a weighted sum of the log-counts plus
per-token effects of the 200 most frequent tokens of some categorical columns
(rarer tokens have none, as in real data where they are too rare to learn), scaled
so ``f`` has standard deviation ``logit_sd`` on a pilot sample, and ``b`` solved on
that pilot for the target positive rate. The Bayes-optimal score of every written
row can be returned. Generation is vectorised and streamed in chunks of
``chunk_rows`` rows: memory stays bounded whatever ``rows`` is (1M rows of Criteo
take a few seconds).
"""

from __future__ import annotations

import datetime as dt
import gzip
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
from scipy.special import expit

from tpsl_flwr.data.ctr.formats import AVAZU_COLUMNS, CRITEO_KAGGLE
from tpsl_flwr.data.ctr.hashing import fmix64
from tpsl_flwr.data.ctr.shapes import (
    AVAZU_EFFECTS,
    AVAZU_INT_BASE,
    AVAZU_VALUES,
    AVAZU_VOCAB,
    CRITEO_CATEGORICAL_SHAPE,
    CRITEO_EFFECTS,
    CRITEO_NUMERIC_SHAPE,
)
from tpsl_flwr.data.ctr.text import format_hex8, format_ints, join_rows
from tpsl_flwr.errors import ConfigError

__all__ = ["GeneratedFile", "write_avazu", "write_criteo"]

_EFFECT_RANKS = 200
_ZIPF = 1.1
_PILOT_ROWS = 20_000


@dataclass(frozen=True)
class GeneratedFile:
    """What a generator wrote.

    Parameters
    ----------
    path : Path
        The file.
    format : str
        ``"criteo"``, ``"criteo-kaggle"`` or ``"avazu"``.
    rows : int
        Data rows written.
    positives : int
        Rows with label 1.
    intercept : float
        The solved intercept ``b`` of the true logit.
    probabilities : np.ndarray or None
        ``(rows,)`` float32 true ``P(y = 1 | x)`` in file order, when asked for.
    """

    path: Path
    format: str
    rows: int
    positives: int
    intercept: float
    probabilities: np.ndarray | None = None

    @property
    def positive_rate(self) -> float:
        """Realised fraction of positive rows."""
        return self.positives / self.rows


# A chunk maker returns the text fields of every column and the feature logit.
_Chunk = Callable[[np.random.Generator, int, int], tuple[list[np.ndarray], np.ndarray]]


def write_criteo(
    path: str | Path,
    rows: int,
    *,
    positive_rate: float = 0.25,
    seed: int = 0,
    kaggle: bool = False,
    logit_sd: float = 1.5,
    return_probabilities: bool = False,
    chunk_rows: int = 50_000,
) -> GeneratedFile:
    r"""Write a Criteo-format file: ``train.txt`` layout, or Kaggle's CSV.

    Parameters
    ----------
    path : str or Path
        Output file; a name ending in ``.gz`` is gzip-compressed.
    rows : int
        Data rows (>= 1).
    positive_rate : float
        Target fraction of clicks in ``(0, 1)``; calibrated for 0.03-0.25 (Criteo's
        1TB logs hold about 3%, the Kaggle challenge about 25.6%).
    seed : int
        Seed of everything drawn.
    kaggle : bool
        Write the Kaggle variant (``Id,Label,I1..`` header, commas) instead of the
        tab-separated ``train.txt``.
    logit_sd : float
        Standard deviation of the feature logit (> 0): higher is easier to learn.
    return_probabilities : bool
        Keep every row's true probability (4 bytes a row).
    chunk_rows : int
        Rows generated and written at a time.

    Returns
    -------
    GeneratedFile
        Path, counts and the solved intercept.

    Raises
    ------
    ConfigError
        If an argument is out of range.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     g = write_criteo(f"{d}/train.txt", 100, seed=1)
    ...     first = g.path.read_text().split("\n")[0]
    >>> g.rows, len(first.split("\t"))
    (100, 40)
    """
    _check(rows, positive_rate, logit_sd, chunk_rows)
    model_rng, pilot_rng, data_rng = _streams(seed)
    keys = model_rng.integers(
        0, 2**62, size=len(CRITEO_CATEGORICAL_SHAPE), dtype=np.int64
    )
    weights = model_rng.normal(size=len(CRITEO_NUMERIC_SHAPE))
    vocab = [min(v, max(10, 2 * rows)) for v, _ in CRITEO_CATEGORICAL_SHAPE]

    def chunk(rng: np.random.Generator, start: int, n: int) -> tuple[list, np.ndarray]:
        fields: list[np.ndarray] = []
        num_part = np.zeros(n)
        for j, (miss, zero, mu, sd, neg) in enumerate(CRITEO_NUMERIC_SHAPE):
            missing = rng.random(n) < miss
            x = np.floor(np.exp(mu + sd * rng.standard_normal(n))).astype(np.int64)
            x[rng.random(n) < zero] = 0
            if neg:
                flip = rng.random(n) < neg
                x[flip] = -rng.integers(1, 4, size=int(flip.sum()))
            t = np.where(missing, 0.0, np.sign(x) * np.log1p(np.abs(x)))
            num_part += weights[j] * (t - mu) / sd
            fields.append(format_ints(x, missing))
        cat_part = np.zeros(n)
        for j, (_, miss) in enumerate(CRITEO_CATEGORICAL_SHAPE):
            missing = rng.random(n) < miss
            rank = _zipf_ranks(rng, n, vocab[j])
            if j in CRITEO_EFFECTS:
                cat_part += _effect(keys[j], rank, missing)
            fields.append(format_hex8(_token(keys[j], rank), missing))
        logit = np.sqrt(0.4) * num_part + np.sqrt(0.6) * cat_part
        return fields, logit

    fmt = CRITEO_KAGGLE.name if kaggle else "criteo"
    header = ",".join(CRITEO_KAGGLE.columns) if kaggle else None
    sep = b"," if kaggle else b"\t"
    first_id = 10_000_000 if kaggle else None
    return _write(
        Path(path), fmt, rows, chunk, positive_rate, logit_sd, sep, header,
        first_id, (model_rng, pilot_rng, data_rng), return_probabilities, chunk_rows,
    )  # fmt: skip


def write_avazu(
    path: str | Path,
    rows: int,
    *,
    positive_rate: float = 0.17,
    seed: int = 0,
    days: int = 10,
    logit_sd: float = 1.5,
    return_probabilities: bool = False,
    chunk_rows: int = 50_000,
) -> GeneratedFile:
    """Write an Avazu-format ``train.csv`` (header, ``hour`` as ``YYMMDDHH``).

    Rows are in time order over ``days`` days from 2014-10-21 00h, as in the real
    file, spread evenly over the hours.

    Parameters
    ----------
    path : str or Path
        Output file; a name ending in ``.gz`` is gzip-compressed.
    rows : int
        Data rows (>= 1).
    positive_rate : float
        Target click rate in ``(0, 1)`` (Avazu's is about 17%).
    seed : int
        Seed of everything drawn.
    days : int
        Days covered (>= 1).
    logit_sd : float
        Standard deviation of the feature logit (> 0).
    return_probabilities : bool
        Keep every row's true probability.
    chunk_rows : int
        Rows generated and written at a time.

    Returns
    -------
    GeneratedFile
        Path, counts and the solved intercept.

    Raises
    ------
    ConfigError
        If an argument is out of range.
    """
    _check(rows, positive_rate, logit_sd, chunk_rows)
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise ConfigError(f"days must be an int >= 1, got {days!r}")
    model_rng, pilot_rng, data_rng = _streams(seed)
    names = AVAZU_COLUMNS[3:]
    keys = dict(zip(names, model_rng.integers(0, 2**62, size=len(names)), strict=True))
    t0 = dt.datetime(2014, 10, 21)
    stamps = np.array(
        [
            int((t0 + dt.timedelta(hours=h)).strftime("%y%m%d%H"))
            for h in range(24 * days)
        ]
    )
    hour_effect = 0.4 * np.sin(2 * np.pi * np.arange(24) / 24)

    def chunk(rng: np.random.Generator, start: int, n: int) -> tuple[list, np.ndarray]:
        index = np.arange(start, start + n, dtype=np.int64)
        hour = ((index % rows) * stamps.size) // rows  # the pilot may exceed rows
        ids = rng.integers(10**17, 2**63 - 1, size=n, dtype=np.int64)
        fields = [format_ints(ids), None, format_ints(stamps[hour])]
        logit = hour_effect[hour % 24].copy()
        for name in names:
            rank = _zipf_ranks(rng, n, min(AVAZU_VOCAB[name], max(10, 2 * rows)))
            if name in AVAZU_EFFECTS:
                logit += _effect(keys[name], rank, None)
            if name in AVAZU_VALUES:
                table = np.array(AVAZU_VALUES[name])
                fields.append(format_ints(table[np.minimum(rank, table.size - 1)]))
            elif name in AVAZU_INT_BASE:
                value = AVAZU_INT_BASE[name] + rank
                if name == "C20":
                    value[rank == 0] = -1
                fields.append(format_ints(value))
            else:
                fields.append(format_hex8(_token(keys[name], rank)))
        return fields, logit

    return _write(
        Path(path), "avazu", rows, chunk, positive_rate, logit_sd, b",",
        ",".join(AVAZU_COLUMNS), None, (model_rng, pilot_rng, data_rng),
        return_probabilities, chunk_rows, label_at=1,
    )  # fmt: skip


def _write(
    path: Path,
    fmt: str,
    rows: int,
    chunk: _Chunk,
    positive_rate: float,
    logit_sd: float,
    sep: bytes,
    header: str | None,
    first_id: int | None,
    rngs: tuple[np.random.Generator, ...],
    return_probabilities: bool,
    chunk_rows: int,
    label_at: int = 0,
) -> GeneratedFile:
    """Calibrate on a pilot, then generate and write chunk by chunk."""
    _, pilot_rng, data_rng = rngs
    _, pilot = chunk(pilot_rng, 0, min(_PILOT_ROWS, max(rows, 1000)))
    scale = logit_sd / max(float(pilot.std()), 1e-12)
    intercept = _solve_intercept(scale * (pilot - pilot.mean()), positive_rate)
    shift = intercept - scale * float(pilot.mean())
    probs: list[np.ndarray] = []
    positives = 0
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with _open_out(path) as out:
            if header is not None:
                out.write(header.encode("ascii") + b"\n")
            for start in range(0, rows, chunk_rows):
                n = min(chunk_rows, rows - start)
                fields, logit = chunk(data_rng, start, n)
                p = expit(scale * logit + shift)
                y = (data_rng.random(n) < p).astype(np.int64)
                positives += int(y.sum())
                if label_at == 1:
                    fields[1] = format_ints(y)
                else:
                    fields.insert(0, format_ints(y))
                if first_id is not None:
                    ids = np.arange(start, start + n) + first_id
                    fields.insert(0, format_ints(ids))
                out.write(join_rows(fields, sep))
                if return_probabilities:
                    probs.append(p.astype(np.float32))
    except BaseException:
        path.unlink(missing_ok=True)  # no half-written file left behind
        raise
    return GeneratedFile(
        path=path,
        format=fmt,
        rows=rows,
        positives=positives,
        intercept=float(shift),
        probabilities=np.concatenate(probs) if return_probabilities else None,
    )


def _open_out(path: Path) -> BinaryIO:
    """Open for writing; gzip (level 1, no timestamp) when the name ends in .gz."""
    if path.suffix == ".gz":
        return gzip.GzipFile(path, "wb", compresslevel=1, mtime=0)  # type: ignore[return-value]
    return path.open("wb")


def _streams(seed: int) -> list[np.random.Generator]:
    """Independent generators for the model, the pilot and the data."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise ConfigError(f"seed must be an int, got {seed!r}")
    return [
        np.random.default_rng(s) for s in np.random.SeedSequence(int(seed)).spawn(3)
    ]


def _zipf_ranks(rng: np.random.Generator, n: int, vocab: int) -> np.ndarray:
    """0-based ranks with ``P(r) ~ (r + 1)^-1.1`` on ``[0, vocab)`` (inverse CDF)."""
    a = 1.0 - _ZIPF
    top = (vocab + 1.0) ** a
    r = np.floor((1.0 + rng.random(n) * (top - 1.0)) ** (1.0 / a)) - 1.0
    return np.clip(r, 0, vocab - 1).astype(np.int64)


def _token(key: np.integer | int, rank: np.ndarray) -> np.ndarray:
    """The 32-bit token of each rank of a column (keyed, so columns differ)."""
    h = fmix64(rank.astype(np.uint64) + np.uint64(int(key)))
    return (h >> np.uint64(32)).astype(np.int64)


def _effect(
    key: np.integer | int, rank: np.ndarray, missing: np.ndarray | None
) -> np.ndarray:
    """Unit-variance effect of the frequent ranks of a column, 0 for rare ones."""
    h = fmix64((rank.astype(np.uint64) << np.uint64(1)) ^ np.uint64(int(key)))
    u = (h >> np.uint64(11)).astype(np.float64) / 2.0**53
    e = np.where(rank < _EFFECT_RANKS, np.sqrt(3.0) * (2.0 * u - 1.0), 0.0)
    if missing is not None:
        e[missing] = 0.5
    return e


def _solve_intercept(logit: np.ndarray, rate: float) -> float:
    """``b`` with ``mean(sigmoid(logit + b)) = rate`` (bisection)."""
    lo, hi = -30.0, 30.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if expit(logit + mid).mean() < rate:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _check(rows: int, positive_rate: float, logit_sd: float, chunk_rows: int) -> None:
    """Validate the arguments every generator shares."""
    if isinstance(rows, bool) or not isinstance(rows, int | np.integer) or rows < 1:
        raise ConfigError(f"rows must be an int >= 1, got {rows!r}")
    if not isinstance(positive_rate, int | float) or not 0.0 < positive_rate < 1.0:
        raise ConfigError(f"positive_rate must be in (0, 1), got {positive_rate!r}")
    if not isinstance(logit_sd, int | float) or not 0.0 < logit_sd < 50.0:
        raise ConfigError(f"logit_sd must be in (0, 50), got {logit_sd!r}")
    if (
        isinstance(chunk_rows, bool)
        or not isinstance(chunk_rows, int)
        or chunk_rows < 1
    ):
        raise ConfigError(f"chunk_rows must be an int >= 1, got {chunk_rows!r}")
