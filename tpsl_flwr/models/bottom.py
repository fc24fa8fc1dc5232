"""A non-label party's bottom model ``f``: its feature slice -> cut-layer embedding.

Initialised as every model here is (:mod:`~tpsl_flwr.models.layers`): from an
explicit ``torch.Generator`` when one is given, else from the global RNG.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.models.layers import (
    EMBEDDING_SD,
    check_hidden,
    check_size,
    field_count,
    mlp,
    no_rng,
    reset_parameters,
)

__all__ = ["FIELD_EMBEDDING_SD", "BottomModel"]

FIELD_EMBEDDING_SD = 0.1
"""Standard deviation of the initial field embeddings (``fields=True``, DLRM).

Their pairwise dot products feed the top model, so a wide start fills it with
random products of rarely seen categories. Measured, in-process, unprotected:
on 5000 generated Criteo rows (26 hashed columns, 8 epochs) the best epoch's
test AUC was 0.72 with 0.1 and 0.65 with 1; on 200k synthetic CTR rows 0.8097
against 0.8104 (Laplace eps 1: 0.7583 against 0.7580).
"""


class BottomModel(nn.Module):
    """A non-label party's model ``f``: its features -> the cut-layer embedding.

    Categorical columns share **one** ``nn.Embedding`` table; column ``j``'s codes
    are shifted by ``offsets[j] = sum(cardinalities[:j])``, so one lookup embeds
    every column. The embeddings are flattened, concatenated after the numeric
    features and passed through an MLP (ReLU between layers, linear output).

    Parameters
    ----------
    num_numeric : int
        Numeric input columns (>= 0).
    cardinalities : sequence of int
        Categories of each categorical column (each >= 1; may be empty, but not
        together with ``num_numeric == 0``).
    embedding_dim : int
        Embedding width per categorical column.
    hidden : sequence of int
        Hidden-layer widths (may be empty: one linear layer).
    out_dim : int
        Width of the cut layer.
    generator : torch.Generator, optional
        Source of the initial weights; the global RNG when None.
    wide : bool
        Add a wide (linear) part, as in wide-and-deep CTR models (Cheng et al.,
        "Wide & Deep Learning for Recommender Systems", DLRS 2016): one weight
        per category and per numeric column, summed into one extra cut-layer
        column (:attr:`width` is ``out_dim + 1``). It starts at 0.
    fields : bool
        Send one vector per field instead of one MLP output, as DLRM does
        (Naumov et al., "Deep Learning Recommendation Model for Personalization
        and Recommendation Systems", 2019): each categorical column's embedding
        and the MLP of the numeric columns (if any), each ``out_dim`` wide
        (``embedding_dim`` must equal ``out_dim``), so the label party can take
        their pairwise dot products
        (:class:`~tpsl_flwr.models.interaction.DotInteractionTop`).
        :attr:`num_fields` vectors make the cut layer; the embeddings start
        from ``N(0, FIELD_EMBEDDING_SD^2)``.

    Raises
    ------
    ConfigError
        If a size is not a positive int (the message names it), there are no
        input columns, or ``fields`` is set with ``embedding_dim != out_dim``.

    Examples
    --------
    >>> g = torch.Generator().manual_seed(0)
    >>> f = BottomModel(2, [3, 5], embedding_dim=4, hidden=(8,), out_dim=6, generator=g)
    >>> f(torch.zeros(7, 2), torch.zeros(7, 2, dtype=torch.long)).shape
    torch.Size([7, 6])
    >>> f = BottomModel(2, [3, 5], embedding_dim=4, out_dim=4, fields=True)
    >>> f.num_fields, f(torch.zeros(7, 2), torch.zeros(7, 2, dtype=torch.long)).shape
    (3, torch.Size([7, 12]))
    """

    offsets: Tensor

    def __init__(
        self,
        num_numeric: int,
        cardinalities: Sequence[int],
        embedding_dim: int = 4,
        hidden: Sequence[int] = (64,),
        out_dim: int = 16,
        *,
        generator: torch.Generator | None = None,
        wide: bool = False,
        fields: bool = False,
    ) -> None:
        super().__init__()
        self.num_numeric = check_size("num_numeric", num_numeric, minimum=0)
        self.cardinalities = tuple(
            check_size(f"cardinalities[{j}]", c) for j, c in enumerate(cardinalities)
        )
        self.embedding_dim = check_size("embedding_dim", embedding_dim)
        self.out_dim = check_size("out_dim", out_dim)
        hidden = check_hidden(hidden)
        if self.num_numeric == 0 and not self.cardinalities:
            raise ConfigError(
                "a bottom model needs at least one column, got num_numeric=0 and "
                "no cardinalities"
            )
        num_cat = len(self.cardinalities)
        self.fields = bool(fields)
        if self.fields and self.embedding_dim != self.out_dim:
            raise ConfigError(
                f"fields: every field vector is out_dim={self.out_dim} wide, got "
                f"embedding_dim={self.embedding_dim}"
            )
        self.embedding: nn.Embedding | None = None
        self.in_dim = self.num_numeric + num_cat * self.embedding_dim
        self.num_fields = field_count(self.num_numeric, num_cat) if self.fields else 1
        self.mlp: nn.Sequential | None = None
        with no_rng():
            if num_cat:
                self.embedding = nn.Embedding(
                    sum(self.cardinalities), self.embedding_dim
                )
            if not self.fields:
                self.mlp = mlp(self.in_dim, hidden, self.out_dim)
            elif self.num_numeric:
                self.mlp = mlp(self.num_numeric, hidden, self.out_dim)
        self.has_wide = bool(wide)
        self.wide: nn.Linear | None = None
        self.wide_embedding: nn.Embedding | None = None
        if wide:
            with no_rng():
                if self.num_numeric:
                    self.wide = nn.Linear(self.num_numeric, 1)
                if num_cat:
                    self.wide_embedding = nn.Embedding(sum(self.cardinalities), 1)
        starts = [0]
        for c in self.cardinalities[:-1]:
            starts.append(starts[-1] + c)
        self.register_buffer(
            "offsets",
            torch.tensor(starts[:num_cat], dtype=torch.long),
            persistent=False,
        )
        reset_parameters(self, generator)
        if self.fields and self.embedding is not None:
            with torch.no_grad():  # N(0, FIELD_EMBEDDING_SD^2)
                self.embedding.weight.mul_(FIELD_EMBEDDING_SD / EMBEDDING_SD)
        if wide:  # the wide part starts at 0: the deep part decides the start
            for parameter in self.wide_parameters():
                nn.init.zeros_(parameter)

    def wide_parameters(self) -> list[nn.Parameter]:
        """The wide (linear) part's parameters; empty without one."""
        parts = (self.wide, self.wide_embedding)
        return [p for part in parts if part is not None for p in part.parameters()]

    @property
    def width(self) -> int:
        """Columns of the cut layer: ``num_fields * out_dim``, plus 1 when wide."""
        return self.num_fields * self.out_dim + self.has_wide

    def forward(self, numeric: Tensor, categorical: Tensor) -> Tensor:
        """Embed a batch.

        Parameters
        ----------
        numeric : Tensor
            ``(batch, num_numeric)`` floats (``(batch, 0)`` when there are none).
        categorical : Tensor
            ``(batch, num_categorical)`` integer codes (``(batch, 0)`` when none).

        Returns
        -------
        Tensor
            ``(batch, out_dim)`` cut-layer embeddings.

        Raises
        ------
        ConfigError
            If the inputs' shapes do not match the model.
        """
        n_cat = len(self.cardinalities)
        if numeric.dim() != 2 or numeric.shape[1] != self.num_numeric:
            raise ConfigError(
                f"numeric must have shape (batch, {self.num_numeric}), got "
                f"{tuple(numeric.shape)}"
            )
        if categorical.dim() != 2 or categorical.shape[1] != n_cat:
            raise ConfigError(
                f"categorical must have shape (batch, {n_cat}), got "
                f"{tuple(categorical.shape)}"
            )
        if numeric.shape[0] != categorical.shape[0]:
            raise ConfigError(
                f"numeric and categorical batch sizes differ: {numeric.shape[0]} "
                f"vs {categorical.shape[0]}"
            )
        emb = (
            None
            if self.embedding is None
            else self.embedding(categorical + self.offsets).flatten(start_dim=1)
        )
        if self.fields:  # [numeric MLP's vector, one embedding per column]
            parts = [] if self.mlp is None else [self.mlp(numeric)]
            deep = torch.cat(parts + ([] if emb is None else [emb]), dim=1)
        else:
            assert self.mlp is not None
            x = numeric if emb is None else torch.cat((numeric, emb), dim=1)
            deep = self.mlp(x)
        if not self.has_wide:
            return deep
        linear = deep.new_zeros((deep.shape[0], 1))
        if self.wide is not None:
            linear = linear + self.wide(numeric)
        if self.wide_embedding is not None:
            weights = self.wide_embedding(categorical + self.offsets)
            linear = linear + weights.sum(dim=1)
        return torch.cat((deep, linear), dim=1)
