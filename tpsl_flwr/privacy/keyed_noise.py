"""Per-sample randomness as a keyed pseudorandom function of the sample id.

The paper's multi-epoch rule (Yang et al., Section 6) asks the label party to
draw each sample's GradPerturb noise once and reuse it whenever the sample comes
back. Storing the draws costs memory and is lost on a crash; instead every
random word here is ``AES-256(key, sample_id || stream || counter)``. The same
key and id always give the same noise (across epochs, processes and restarts),
different ids, streams or counters give independent-looking words, and without
the key the words cannot be predicted (AES as a pseudorandom function; the
PRP/PRF switching bound is ``q^2 / 2^129`` for ``q`` blocks).

The key lives with the label party only. It comes from the operating system
unless the user asks for a seed, in which case anyone who knows the seed can
recompute (and so subtract) the noise: such keys report ``secure = False``.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from tpsl_flwr._util.checks import check_sample_ids
from tpsl_flwr.errors import ConfigError

LOGGER = logging.getLogger(__name__)

KEY_BYTES = 32
_BLOCK = np.dtype([("sample_id", "<u8"), ("stream", "<u4"), ("counter", "<u4")])
_TWO_POW_MINUS_53 = 2.0**-53
_MAX_WORDS = 2**33
"""Words in one (key, id, stream) sequence: two per value of the uint32 counter."""


@dataclass(frozen=True)
class NoiseKey:
    """A secret key from which all of a run's per-sample noise is derived.

    Parameters
    ----------
    key
        32 secret bytes (AES-256 key).
    secure
        ``False`` when the key was derived from a user-given seed.

    Examples
    --------
    >>> key = NoiseKey.from_seed(7)
    >>> ids = np.array([3, 1, 3])
    >>> words = key.words(ids, stream=1, count=2)
    >>> bool((words[0] == words[2]).all()), bool((words[0] == words[1]).all())
    (True, False)
    """

    key: bytes = field(repr=False)
    secure: bool = True
    binding: tuple[tuple[str, object], ...] | None = field(
        default=None, compare=False, repr=False
    )
    """The noise settings of the one release this key serves (sorted
    ``(name, value)`` pairs), set by the label party's store when it opens the
    release: whatever trains with the key checks them against its own
    (:meth:`bound_to`). ``None``: a key built by hand (tests, audits)."""

    def __post_init__(self) -> None:
        if not isinstance(self.key, bytes) or len(self.key) != KEY_BYTES:
            size = len(self.key) if isinstance(self.key, bytes) else type(self.key)
            raise ConfigError(f"noise key must be {KEY_BYTES} bytes, got {size}")

    @classmethod
    def from_os(cls) -> NoiseKey:
        """Draw a fresh key from the operating system's CSPRNG."""
        return cls(secrets.token_bytes(KEY_BYTES), secure=True)

    @classmethod
    def from_seed(cls, seed: int) -> NoiseKey:
        """Derive a reproducible, **not secure**, key from an integer seed."""
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"seed must be an integer, got {seed!r}")
        digest = hashlib.sha256(f"tpsl-flwr noise key, seed={seed}".encode()).digest()
        return cls(digest, secure=False)

    @classmethod
    def from_hex(cls, text: str, secure: bool = True) -> NoiseKey:
        """Rebuild a key saved with :meth:`to_hex` (for resuming a run)."""
        try:
            raw = bytes.fromhex(text)
        except ValueError as err:
            raise ConfigError("noise key must be hex text") from err
        return cls(raw, secure=secure)

    def derive(self, context: bytes) -> NoiseKey:
        """The key of one release: HMAC-SHA256 of ``context`` under this key.

        The label party derives every run's key from the key it was given and
        everything that fixes the noise (the binding and the labels), so two
        runs at different settings never share noise words, even from one
        seed (two Laplace releases under one word at eps 1 and 2 would give
        ``c1 - 2 c2 = -y`` exactly). ``secure`` is kept.

        Examples
        --------
        >>> root = NoiseKey.from_seed(1)
        >>> root.derive(b"eps=1") == root.derive(b"eps=1")
        True
        >>> root.derive(b"eps=1").key == root.derive(b"eps=2").key
        False
        """
        if not isinstance(context, bytes):
            raise ConfigError(f"context must be bytes, got {type(context).__name__}")
        digest = hmac.new(self.key, b"tpsl-flwr release key v1" + context, "sha256")
        return NoiseKey(digest.digest(), secure=self.secure)

    def bound_to(self, settings: Mapping[str, object]) -> NoiseKey:
        """The same key, carrying the settings of the one release it serves.

        Examples
        --------
        >>> key = NoiseKey.from_seed(1).bound_to({"mechanism": "laplace"})
        >>> dict(key.binding), key == NoiseKey.from_seed(1)
        ({'mechanism': 'laplace'}, True)
        """
        return NoiseKey(
            self.key, secure=self.secure, binding=tuple(sorted(settings.items()))
        )

    def to_hex(self) -> str:
        """The key as hex text, to store in the label party's own checkpoint."""
        return self.key.hex()

    @property
    def fingerprint(self) -> str:
        """A short public identifier of the key (no information about it)."""
        return hashlib.sha256(b"fingerprint" + self.key).hexdigest()[:12]

    def words(self, sample_ids: object, stream: int, count: int) -> np.ndarray:
        """Return ``count`` pseudorandom 64-bit words for each sample id.

        Parameters
        ----------
        sample_ids
            1-D integer array of non-negative sample ids.
        stream
            Domain separator (a non-negative ``uint32``): one per use, so that,
            e.g., the transcript noise and the top-model noise are independent.
        count
            Words per sample (>= 1).

        Returns
        -------
        numpy.ndarray
            ``uint64`` array of shape ``(len(sample_ids), count)``.
        """
        ids = check_sample_ids(sample_ids)
        if not 0 <= stream < 2**32:
            raise ConfigError(f"stream must be a uint32, got {stream}")
        if count < 1:
            raise ConfigError(f"count must be >= 1, got {count}")
        blocks_per_id = (count + 1) // 2
        plain = np.empty((ids.size, blocks_per_id), dtype=_BLOCK)
        plain["sample_id"] = ids[:, None]
        plain["stream"] = stream
        plain["counter"] = np.arange(blocks_per_id, dtype=np.uint32)[None, :]
        encryptor = Cipher(algorithms.AES(self.key), modes.ECB()).encryptor()
        cipher = encryptor.update(plain.tobytes()) + encryptor.finalize()
        words = np.frombuffer(cipher, dtype="<u8").reshape(ids.size, 2 * blocks_per_id)
        return words[:, :count].astype(np.uint64)

    def words_at(
        self,
        sample_ids: object,
        stream: int,
        starts: object,
        count: int = 1,
        stride: int = 1,
    ) -> np.ndarray:
        """Return words at per-sample offsets of the same sequence as :meth:`words`.

        Row ``i`` holds the words with indices ``starts[i] + stride * c``,
        ``c = 0 .. count - 1``, of sample ``i``'s sequence: word ``n`` of a
        sample is always ``words(ids, stream, n + 1)[:, n]``. Rejection
        samplers use this to read a variable number of words per sample while
        a sample's ``n``-th word stays a fixed function of (key, id, stream).

        Parameters
        ----------
        sample_ids
            1-D integer array of non-negative sample ids.
        stream
            Domain separator, as in :meth:`words`.
        starts
            Non-negative word index of the first word of each row, one per id.
        count
            Words per row (>= 1).
        stride
            Index step between a row's words (>= 1).

        Returns
        -------
        numpy.ndarray
            ``uint64`` array of shape ``(len(sample_ids), count)``.

        Raises
        ------
        ConfigError
            For bad ids, stream, count or stride, starts of the wrong shape or
            negative, or an index past the ``2^33`` words of a sample's
            sequence (the 32-bit block counter).
        """
        ids = check_sample_ids(sample_ids)
        if not 0 <= stream < 2**32:
            raise ConfigError(f"stream must be a uint32, got {stream}")
        if count < 1 or stride < 1:
            raise ConfigError(f"count and stride must be >= 1, got {count}, {stride}")
        first = np.asarray(starts, dtype=np.int64)
        if first.shape != ids.shape or (first.size and first.min() < 0):
            raise ConfigError(f"starts must be {ids.size} indices >= 0, got {starts}")
        index = first[:, None] + stride * np.arange(count, dtype=np.int64)[None, :]
        if index.size and index.max() >= _MAX_WORDS:
            raise ConfigError(f"word index {index.max()} is past {_MAX_WORDS}")
        plain = np.empty(index.shape, dtype=_BLOCK)
        plain["sample_id"] = ids[:, None]
        plain["stream"] = stream
        plain["counter"] = index >> 1
        encryptor = Cipher(algorithms.AES(self.key), modes.ECB()).encryptor()
        cipher = encryptor.update(plain.tobytes()) + encryptor.finalize()
        pairs = np.frombuffer(cipher, dtype="<u8").reshape(index.size, 2)
        picked = pairs[np.arange(index.size), (index & 1).ravel()]
        return picked.reshape(index.shape).astype(np.uint64)

    def uniforms(self, sample_ids: object, stream: int, count: int) -> np.ndarray:
        """Return uniforms on ``[0, 1)`` with 53 random bits, shape ``(n, count)``."""
        return uniforms53(self.words(sample_ids, stream, count))


def uniforms53(words: np.ndarray) -> np.ndarray:
    """Map 64-bit words to uniforms on ``[0, 1)`` (their top 53 bits)."""
    return (words >> np.uint64(11)).astype(np.float64) * _TWO_POW_MINUS_53


def open_uniforms(words: np.ndarray) -> np.ndarray:
    """Map 64-bit words to uniforms on the open interval ``(0, 1)``.

    Uses the top 52 bits and centres each value in its cell, so neither 0 nor
    1 can occur (useful before an inverse CDF); with 53 bits the top cell's
    centre would round to 1.0.
    """
    return ((words >> np.uint64(12)).astype(np.float64) + 0.5) * 2.0**-52
