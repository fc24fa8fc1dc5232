"""P_N, a non-label party, as plain torch: its feature columns and bottom model.

It embeds sample ids and applies the perturbed gradients it receives. Its
contract is checked on construction (the feature splits and the bottom model's
call signature), so a mistake fails on the first call with one line.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from tpsl_flwr._util.checks import check_sample_ids
from tpsl_flwr._util.finite import all_finite
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.parties.model_state import load_checkpoint_state
from tpsl_flwr.parties.optim import OptimizerFactory, adam, set_lr_scale

EMBED_CHUNK_ROWS = 1 << 13
"""Rows per forward pass of an embedding without gradient (evaluation)."""

FeatureSplit = tuple[np.ndarray | Any, np.ndarray | Any | None] | np.ndarray
"""One split of a non-label party's features: ``(numeric, categorical)``.

``categorical`` may be ``None`` (no categorical columns), and a lone numeric
array means the same. Arrays that gather their rows on demand (a mapped
Criteo/Avazu view) are kept as they are and read per batch.
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
    wide_optimizer
        Factory building a separate optimizer of the bottom model's wide part
        (its ``wide_parameters()``), e.g. :func:`~tpsl_flwr.parties.ftrl.ftrl`;
        ``optimizer`` then takes every other parameter. None: ``optimizer``
        takes them all.

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
        *,
        wide_optimizer: OptimizerFactory | None = None,
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
        self.optimizer, self.wide_optimizer = _optimizers(
            bottom, optimizer or adam(1e-3), wide_optimizer
        )
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
        ids = check_sample_ids(sample_ids)
        with torch.no_grad():
            if ids.size <= EMBED_CHUNK_ROWS:
                return self._forward(ids, split)
            # Evaluation queries (a whole split): bounded activations.
            return torch.cat(
                [
                    self._forward(ids[a : a + EMBED_CHUNK_ROWS], split)
                    for a in range(0, ids.size, EMBED_CHUNK_ROWS)
                ]
            )

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
        if not all_finite(grad):
            raise ConfigError("received gradient contains NaN or inf")
        optimizers = [self.optimizer, *filter(None, [self.wide_optimizer])]
        for optimizer in optimizers:
            optimizer.zero_grad()
        out.backward(grad)
        for optimizer in optimizers:
            optimizer.step()

    def set_lr_scale(self, scale: float) -> None:
        """Scale the optimizers' initial learning rates (the label party's schedule)."""
        set_lr_scale(self.optimizer, scale)
        if self.wide_optimizer is not None:
            set_lr_scale(self.wide_optimizer, scale)

    def state_dict(self) -> dict[str, Any]:
        """Bottom model and optimizer state (and the wide optimizer's, if any)."""
        state = {
            "bottom": self.bottom.state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }
        if self.wide_optimizer is not None:
            state["wide_optimizer"] = self.wide_optimizer.state_dict()
        return state

    def load_weights(self, weights: dict[str, Any]) -> None:
        """Load the bottom model's weights alone (their tail average, at the end).

        The optimizers keep their state: no step follows.

        Raises
        ------
        ConfigError
            If ``weights`` do not fit the bottom model.
        """
        load_checkpoint_state(self.bottom, weights, "bottom model")
        self._kept = None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`.

        Raises
        ------
        ConfigError
            If the checkpoint was written with a separate wide optimizer and
            this party has none, or the other way round.
        """
        load_checkpoint_state(self.bottom, state["bottom"], "bottom model")
        has_wide = "wide_optimizer" in state
        if has_wide != (self.wide_optimizer is not None):
            written, here = ("a", "none") if has_wide else ("no", "one")
            raise ConfigError(
                f"the checkpoint was written with {written} separate wide "
                f"optimizer and this run has {here}: resume with the settings it "
                "was written with (wide, wide-optimizer)"
            )
        self.optimizer.load_state_dict(state["optimizer"])
        if self.wide_optimizer is not None:
            self.wide_optimizer.load_state_dict(state["wide_optimizer"])
        self._kept = None


def _optimizers(
    bottom: nn.Module, deep: OptimizerFactory, wide: OptimizerFactory | None
) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer | None]:
    """``(optimizer, wide optimizer)``: the wide one over ``wide_parameters()``.

    Raises
    ------
    ConfigError
        If ``wide`` is given and the bottom model has no wide part.
    """
    if wide is None:
        return deep(bottom.parameters()), None
    wide_parameters = getattr(bottom, "wide_parameters", None)
    own = list(wide_parameters()) if callable(wide_parameters) else []
    if not own:
        raise ConfigError(
            "a wide optimizer needs a bottom model with a wide part "
            "(wide_parameters() not empty); set wide = true"
        )
    ids = {id(p) for p in own}
    rest = [p for p in bottom.parameters() if id(p) not in ids]
    return deep(rest), wide(own)


class _GatheredRows:
    """Rows of a table gathered per batch (``table[ids]``), as a tensor.

    Wraps a split whose arrays are not in memory (a memory-mapped Criteo/Avazu
    view, :class:`~tpsl_flwr.data.mapped.MappedColumns`): indexing with a
    tensor of ids or a slice returns only those rows, so the party never
    copies its whole table.
    """

    def __init__(self, source: Any) -> None:
        self.source = source
        self.shape = torch.Size(source.shape)
        self.ndim = 2

    def __getitem__(self, key: Tensor | slice) -> Tensor:
        rows = key.numpy() if isinstance(key, Tensor) else key
        return torch.from_numpy(np.ascontiguousarray(self.source[rows]))


def _feature_split(split: object, given: object) -> tuple[Tensor, Tensor]:
    """One split as ``(float32 (n, c), int64 (n, m))`` tensors, or a ConfigError.

    Arrays that gather their rows on demand (``gathers_rows``) stay as they
    are, behind :class:`_GatheredRows`.
    """
    where = f"features[{split!r}]"
    if isinstance(given, tuple | list):
        if len(given) != 2:
            raise ConfigError(
                f"{where} must be a (numeric, categorical) pair, got {len(given)} items"
            )
        numeric, categorical = given
    else:
        numeric, categorical = given, None
    if getattr(numeric, "gathers_rows", False) and getattr(
        categorical, "gathers_rows", False
    ):
        return _GatheredRows(numeric), _GatheredRows(categorical)  # type: ignore[return-value]
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
