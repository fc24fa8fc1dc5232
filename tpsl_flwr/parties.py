"""The two roles of split learning as plain torch code (no Flower).

* :class:`LabelParty` (P_L) holds the training labels, the top model ``h``, its
  optimizer, the mechanism and the secret noise key. Given the non-label
  parties' embeddings for a batch of sample ids, it runs GradPerturb, updates
  ``h`` with the *perturbed* signal and returns the perturbed cut-layer
  gradient: the only label-derived thing that ever leaves it (Yang et al.,
  Algorithm 3 and Section 4.2).
* :class:`NonLabelParty` (P_N) holds one vertical slice of the features and a
  bottom model ``f``; it embeds sample ids and applies received gradients.

The Flower roles (:mod:`tpsl_flwr.strategies`, :mod:`tpsl_flwr.simulations`)
wrap these; so can any other transport.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from tpsl_flwr.errors import ConfigError, PrivacyError
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms import Mechanism
from tpsl_flwr.privacy.noisy_labels import (
    STREAM_CUT_GAUSSIAN,
    STREAM_TOP_UPDATE,
    STREAM_TRANSCRIPT,
    NoisyLabels,
    draw_noisy_labels,
)
from tpsl_flwr.privacy.perturb import cut_placement_backward, logits_placement_backward
from tpsl_flwr.validation import check_labels, check_placement, check_sample_ids

OptimizerFactory = Callable[[Any], torch.optim.Optimizer]
_STREAMS_PER_EPOCH = 4
NOISE_CACHE_BYTES = 256 * 2**20
"""Most memory :class:`LabelParty` spends on precomputed per-sample noise."""


def adam(lr: float) -> OptimizerFactory:
    """An optimizer factory: Adam with learning rate ``lr``."""
    if not lr > 0:
        raise ConfigError(f"lr must be > 0, got {lr}")
    return lambda params: torch.optim.Adam(params, lr=lr)


def noise_stream(base: int, epoch: int, reuse_noise: bool) -> int:
    """The keyed-noise stream of ``base`` in ``epoch``.

    With reuse (the paper's multi-epoch rule) every epoch uses the same stream,
    so each sample gets the same noise every time; without it each epoch gets
    fresh, independent noise (and the accounting composes).
    """
    return base if reuse_noise else base + _STREAMS_PER_EPOCH * (epoch + 1)


class LabelParty:
    """P_L: labels, top model, optimizer, mechanism and noise key.

    Parameters
    ----------
    top
        The top model ``h`` mapping concatenated embeddings to logits (one
        logit for two classes, else ``k``).
    labels
        Training labels indexed by sample id (``labels[i]`` is sample ``i``'s).
    mechanism
        The GradPerturb mechanism (its ``num_classes`` must fit ``labels``).
    key
        The secret noise key (never leaves this object but for checkpoints
        the label party writes for itself).
    placement
        ``"logits"`` (``epsilon``) or ``"cut"`` (``2 epsilon``).
    optimizer
        Factory building the top model's optimizer from its parameters.
    reuse_noise
        Draw each sample's noise once and reuse it in every epoch.
    noise_cache_bytes
        Each sample's noise is a keyed function of (key, sample id, stream), so
        the party derives a stream's noise for all training samples at once,
        the first time the stream is used, and indexes it per batch: the same
        values as drawing per batch, at almost no cost per step. Streams whose
        noise would take more than this many bytes are drawn per batch; 0
        turns the cache off. Only the streams of the current epoch are kept.
    """

    def __init__(
        self,
        top: nn.Module,
        labels: np.ndarray,
        mechanism: Mechanism,
        key: NoiseKey,
        placement: str = "logits",
        optimizer: OptimizerFactory | None = None,
        reuse_noise: bool = True,
        noise_cache_bytes: int = NOISE_CACHE_BYTES,
    ) -> None:
        self.top = top
        self.labels = check_labels(labels, mechanism.num_classes)
        self.mechanism = mechanism
        self.key = key
        self.placement = check_placement(placement)
        self.reuse_noise = reuse_noise
        self.optimizer = (optimizer or adam(1e-3))(top.parameters())
        self.steps = 0
        self.noise_cache_bytes = int(noise_cache_bytes)
        self._noise_cache: dict[tuple[int, int | None], NoisyLabels] = {}

    @property
    def num_outputs(self) -> int:
        """Number of logits of the top model's head."""
        return 1 if self.mechanism.is_binary else self.mechanism.num_classes

    def _noisy(
        self, ids: np.ndarray, base: int, epoch: int, width: int | None = None
    ) -> NoisyLabels:
        stream = noise_stream(base, epoch, self.reuse_noise)
        cached = self._all_noise(stream, width)
        if cached is None:
            return draw_noisy_labels(
                self.mechanism,
                self.labels[ids],
                ids,
                self.key,
                stream,
                additive_dim=width,
            )
        additive = None if cached.additive is None else cached.additive[ids]
        return NoisyLabels(cached.coefficients[ids], additive)

    def _all_noise(self, stream: int, width: int | None) -> NoisyLabels | None:
        """Every training sample's noise on ``stream`` (None: over the cache cap)."""
        found = self._noise_cache.get((stream, width))
        if found is not None:
            return found
        n, k = self.labels.size, self.mechanism.num_classes
        columns = k
        if self.mechanism.additive:
            logits = 1 if self.mechanism.is_binary else k
            columns += logits if width is None else width
        if n * columns * 8 > self.noise_cache_bytes:
            return None
        if not self.reuse_noise:  # a new epoch's streams replace the old ones
            epoch_of = (stream - 1) // _STREAMS_PER_EPOCH
            self._noise_cache = {
                key: value
                for key, value in self._noise_cache.items()
                if (key[0] - 1) // _STREAMS_PER_EPOCH == epoch_of
            }
        found = draw_noisy_labels(
            self.mechanism,
            self.labels,
            np.arange(n, dtype=np.int64),
            self.key,
            stream,
            additive_dim=width,
        )
        self._noise_cache[(stream, width)] = found
        return found

    def check_ids(self, sample_ids: object) -> np.ndarray:
        """Validate training sample ids against the labels held."""
        ids = check_sample_ids(sample_ids)
        if ids.max() >= self.labels.size:
            raise ConfigError(
                f"sample id {int(ids.max())} is outside the {self.labels.size} "
                "training labels held by the label party"
            )
        return ids

    def train_step(
        self, sample_ids: object, embeddings: Tensor, epoch: int = 0
    ) -> Tensor:
        """One TPSL step: perturb, update the top model, return the gradient to send.

        Parameters
        ----------
        sample_ids
            ``(n,)`` training sample ids of the batch.
        embeddings
            ``(n, d)`` concatenated cut-layer embeddings of those samples.
        epoch
            The current epoch (selects the noise stream when noise is not reused).

        Returns
        -------
        torch.Tensor
            The perturbed cut-layer gradient ``(n, d)`` (float32).

        Raises
        ------
        PrivacyError
            If the embeddings are not finite or do not fit the batch; nothing
            is updated or returned then (fail closed).
        """
        ids = self.check_ids(sample_ids)
        emb = torch.as_tensor(embeddings, dtype=torch.float32)
        if emb.ndim != 2 or emb.shape[0] != ids.size:
            raise PrivacyError(
                f"embeddings of shape {tuple(emb.shape)} do not fit a batch of "
                f"{ids.size} sample ids"
            )
        if not torch.isfinite(emb).all():
            raise PrivacyError("embeddings contain NaN or inf")
        self.optimizer.zero_grad()
        transcript_width = None
        if self.placement == "cut" and self.mechanism.additive:
            transcript_width = emb.shape[1]
        base = STREAM_CUT_GAUSSIAN if transcript_width else STREAM_TRANSCRIPT
        transcript = self._noisy(ids, base, epoch, transcript_width)
        if self.placement == "logits":
            grad, _ = logits_placement_backward(self.top, emb, transcript)
        else:
            update = self._noisy(ids, STREAM_TOP_UPDATE, epoch)
            grad, _ = cut_placement_backward(self.top, emb, transcript, update)
        if not torch.isfinite(grad).all():
            self.optimizer.zero_grad()
            raise PrivacyError("the perturbed gradient is not finite; nothing sent")
        self.optimizer.step()
        self.steps += 1
        return grad.to(torch.float32)

    @torch.no_grad()
    def predict(self, embeddings: Tensor) -> np.ndarray:
        """Class probabilities ``(n, k)`` for embeddings (evaluation only)."""
        logits = self.top(torch.as_tensor(embeddings, dtype=torch.float32))
        if logits.shape[1] == 1:
            positive = torch.sigmoid(logits[:, 0])
            return torch.stack([1 - positive, positive], dim=1).numpy()
        return torch.softmax(logits, dim=1).numpy()

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume but the key, which is named by fingerprint.

        The key itself is kept apart, in the label party's key file
        (:class:`~tpsl_flwr.label_store.LabelStore`).
        """
        return {
            "top": self.top.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "steps": self.steps,
            "key_fingerprint": self.key.fingerprint,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; it must have been saved under this key."""
        if state.get("key_fingerprint") != self.key.fingerprint:
            raise ConfigError(
                "the checkpoint was written with another noise key "
                f"(fingerprint {state.get('key_fingerprint')}, this run "
                f"{self.key.fingerprint})"
            )
        self.top.load_state_dict(state["top"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state["steps"])


FeatureSplit = tuple[np.ndarray, np.ndarray | None] | np.ndarray
"""One split of a non-label party's features: ``(numeric, categorical)``.

``categorical`` may be ``None`` (no categorical columns), and a lone numeric
array means the same.
"""


class NonLabelParty:
    """P_N: vertical feature slices (by split) and a bottom model.

    Parameters
    ----------
    features
        ``split -> (numeric, categorical)`` arrays indexed by sample id (row
        ``i`` is sample ``i``; ids are ``0..n-1`` in increasing record-id
        order). It must hold a ``"train"`` split, the one gradients apply to;
        ``"test"`` is the one the label party evaluates on. ``numeric`` is
        ``(n, c)`` float, ``categorical`` ``(n, m)`` int codes; ``None`` (or a
        lone numeric array instead of the pair) means no categorical columns,
        an empty ``(n, 0)`` int64 array.
    bottom
        The bottom model ``f(numeric, categorical) -> (n, d)``; checked once
        here with a one-row forward (eval mode, no gradient).
    optimizer
        Factory building the bottom model's optimizer.

    Raises
    ------
    ConfigError
        On the first call, in one line naming the argument and what was
        expected: ``features`` not a dict with a ``"train"`` split, a split
        that is not a ``(numeric, categorical)`` pair of 2-D arrays with the
        same rows, or a bottom model that cannot be called as
        ``f(numeric, categorical) -> (n, d)``.

    Examples
    --------
    >>> from torch import nn
    >>> x = np.zeros((4, 3), dtype=np.float32)
    >>> class Bottom(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.layer = nn.Linear(3, 2)
    ...
    ...     def forward(self, numeric, categorical):
    ...         return self.layer(numeric)
    >>> NonLabelParty({"train": (x, None)}, Bottom()).embed([0, 2]).shape
    torch.Size([2, 2])
    >>> NonLabelParty({"train": x}, nn.Linear(3, 2))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tpsl_flwr.errors.ConfigError: bottom model must be called as f(numeric, ...
    """

    def __init__(
        self,
        features: dict[str, FeatureSplit],
        bottom: nn.Module,
        optimizer: OptimizerFactory | None = None,
    ) -> None:
        if not isinstance(features, dict):
            raise ConfigError(
                "features must be a dict split -> (numeric, categorical), got a "
                f"{type(features).__name__}"
            )
        if "train" not in features:
            raise ConfigError(
                "features must have a 'train' split (the ids gradients apply "
                f"to); got splits {sorted(features)}"
            )
        self.features: dict[str, tuple[Tensor, Tensor]] = {
            str(split): _feature_split(split, given)
            for split, given in features.items()
        }
        self.bottom = bottom
        _check_bottom(bottom, *self.features["train"])
        self.optimizer = (optimizer or adam(1e-3))(bottom.parameters())
        # The last training batch's ids and output, graph kept, for the
        # gradient that comes back for it before any parameter changes.
        self._kept: tuple[np.ndarray, Tensor] | None = None

    def num_samples(self, split: str = "train") -> int:
        """Number of samples of ``split`` whose features this party holds."""
        return int(self._split(split)[0].shape[0])

    def _split(self, split: str) -> tuple[Tensor, Tensor]:
        if split not in self.features:
            raise ConfigError(
                f"unknown split {split!r}; this party holds {sorted(self.features)}"
            )
        return self.features[split]

    def _forward(self, sample_ids: object, split: str) -> Tensor:
        numeric, categorical = self._split(split)
        ids = check_sample_ids(sample_ids)
        if ids.max() >= numeric.shape[0]:
            raise ConfigError(
                f"sample id {int(ids.max())} is not in this party's {split} "
                f"partition ({numeric.shape[0]} samples)"
            )
        rows = torch.as_tensor(ids)
        return self.bottom(numeric[rows], categorical[rows])

    def embed(
        self, sample_ids: object, split: str = "train", keep_graph: bool = False
    ) -> Tensor:
        """Embeddings ``(n, d)`` of the given samples (detached).

        With ``keep_graph`` (training batches), the forward graph is kept so
        that :meth:`apply_gradient` for the same ids, arriving before any other
        parameter update, needs no second forward pass.
        """
        if keep_graph:
            out = self._forward(sample_ids, split)
            self._kept = (np.asarray(sample_ids).copy(), out)
            return out.detach()
        with torch.no_grad():
            return self._forward(sample_ids, split)

    def apply_gradient(self, sample_ids: object, gradient: object) -> None:
        """Back-propagate a received cut-layer gradient and step the optimizer.

        The forward pass is recomputed for ``sample_ids`` (the bottom model is
        deterministic), so no graph needs to be kept between messages, unless
        :meth:`embed` kept it for exactly these ids with the current parameters.
        """
        kept, self._kept = self._kept, None
        if kept is not None and np.array_equal(kept[0], np.asarray(sample_ids)):
            out = kept[1]
        else:
            out = self._forward(sample_ids, "train")
        grad = torch.as_tensor(gradient, dtype=torch.float32)
        if grad.shape != out.shape:
            raise ConfigError(
                f"received gradient of shape {tuple(grad.shape)} for embeddings of "
                f"shape {tuple(out.shape)}"
            )
        if not torch.isfinite(grad).all():
            raise ConfigError("received gradient contains NaN or inf")
        self.optimizer.zero_grad()
        out.backward(grad)
        self.optimizer.step()

    def state_dict(self) -> dict[str, Any]:
        """Bottom model and optimizer state."""
        return {
            "bottom": self.bottom.state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.bottom.load_state_dict(state["bottom"])
        self.optimizer.load_state_dict(state["optimizer"])
        self._kept = None


def _feature_split(split: object, given: object) -> tuple[Tensor, Tensor]:
    """One split as ``(float32 (n, c), int64 (n, m))`` tensors, or a ConfigError."""
    where = f"features[{split!r}]"
    if isinstance(given, tuple | list):
        if len(given) != 2:
            raise ConfigError(
                f"{where} must be a (numeric, categorical) pair, got {len(given)} items"
            )
        numeric, categorical = given
    else:
        numeric, categorical = given, None
    try:
        num = torch.as_tensor(np.asarray(numeric, dtype=np.float32))
    except (TypeError, ValueError) as err:
        raise ConfigError(
            f"{where} numeric must be a float array (n, columns): {err}"
        ) from None
    if num.ndim != 2:
        raise ConfigError(
            f"{where} numeric must be 2-D (n, columns), got shape {tuple(num.shape)}"
        )
    if categorical is None:
        cat = torch.zeros((num.shape[0], 0), dtype=torch.int64)
    else:
        codes = np.asarray(categorical)
        if codes.size and not np.issubdtype(codes.dtype, np.integer):
            raise ConfigError(
                f"{where} categorical must hold integer codes, got dtype {codes.dtype}"
            )
        cat = torch.as_tensor(codes.astype(np.int64, copy=False))
        if cat.ndim != 2:
            raise ConfigError(
                f"{where} categorical must be 2-D (n, columns), got shape "
                f"{tuple(cat.shape)}; pass None for no categorical columns"
            )
    if num.shape[0] != cat.shape[0]:
        raise ConfigError(
            f"{where}: numeric ({num.shape[0]} rows) and categorical "
            f"({cat.shape[0]} rows) features disagree"
        )
    return num, cat


def _check_bottom(bottom: nn.Module, numeric: Tensor, categorical: Tensor) -> None:
    """Raise unless ``bottom(numeric[:1], categorical[:1])`` is ``(rows, d)``."""
    num, cat = numeric[:1], categorical[:1]
    expected = (
        "bottom model must be called as f(numeric, categorical) -> (n, d); calling "
        f"it with a {tuple(num.shape)} float32 and a {tuple(cat.shape)} int64 tensor"
    )
    training = bottom.training
    bottom.eval()  # no dropout draw, no batch-norm update, one row allowed
    try:
        with torch.no_grad():
            out = bottom(num, cat)
    except (TypeError, RuntimeError, ValueError, IndexError) as err:
        reason = " ".join(str(err).split())
        raise ConfigError(f"{expected} raised {type(err).__name__}: {reason}") from err
    finally:
        bottom.train(training)
    if not isinstance(out, Tensor):
        raise ConfigError(f"{expected} returned a {type(out).__name__}, not a tensor")
    if out.ndim != 2 or out.shape[0] != num.shape[0]:
        raise ConfigError(f"{expected} returned shape {tuple(out.shape)}")
