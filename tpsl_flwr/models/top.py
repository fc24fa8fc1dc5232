"""The label party's top model ``h``: concatenated embeddings -> logits.

One logit for binary labels, ``k`` for ``k`` classes
(:func:`~tpsl_flwr.models.outputs.num_outputs_for`); the dot-interaction top of
DLRM is :mod:`~tpsl_flwr.models.interaction`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.models.layers import (
    check_embeddings,
    check_hidden,
    check_size,
    mlp,
    no_rng,
    reset_parameters,
)

__all__ = ["TopModel"]


class TopModel(nn.Module):
    """The label party's model ``h``: concatenated embeddings -> logits.

    Parameters
    ----------
    in_dim : int
        Width of the concatenated cut-layer embeddings of all parties.
    hidden : sequence of int
        Hidden-layer widths (ReLU between layers; may be empty).
    num_outputs : int
        Logits out: 1 for binary labels, ``k`` for ``k`` classes
        (:func:`num_outputs_for`).
    generator : torch.Generator, optional
        Source of the initial weights; the global RNG when None.
    wide : bool
        Add a linear path from the embeddings to the logits, so each node's
        wide column reaches the logit directly.
    wide_columns : sequence of int
        The input columns that are the nodes' wide columns: the linear path
        starts at 1 on them (each node's wide part is added to every logit, as
        in wide and deep models) and at 0 elsewhere. Had it started at 0 on them
        too, the wide parts, which start at 0, would get no gradient at first:
        on 5000 generated Criteo rows (DLRM, unprotected, 8 epochs) the best
        epoch's test AUC was 0.738 with the wide columns at 1, 0.725 at 0.

    Raises
    ------
    ConfigError
        If a size is not a positive int (the message names it), or a wide
        column is given without ``wide`` or out of range.

    Examples
    --------
    >>> h = TopModel(12, hidden=(8,), num_outputs=1)
    >>> h(torch.zeros(5, 12)).shape
    torch.Size([5, 1])
    """

    def __init__(
        self,
        in_dim: int,
        hidden: Sequence[int] = (64,),
        num_outputs: int = 1,
        *,
        generator: torch.Generator | None = None,
        wide: bool = False,
        wide_columns: Sequence[int] = (),
    ) -> None:
        super().__init__()
        self.in_dim = check_size("in_dim", in_dim)
        self.num_outputs = check_size("num_outputs", num_outputs)
        hidden = check_hidden(hidden)
        columns = list(wide_columns)
        if columns and not wide:
            raise ConfigError(f"wide_columns {columns} given without wide=True")
        if any(not 0 <= c < self.in_dim for c in columns):
            raise ConfigError(
                f"wide_columns must be in [0, {self.in_dim}), got {columns}"
            )
        with no_rng():
            self.mlp = mlp(self.in_dim, hidden, self.num_outputs)
            self.skip: nn.Linear | None = None
            if wide:
                self.skip = nn.Linear(self.in_dim, self.num_outputs, bias=False)
        reset_parameters(self, generator)
        if self.skip is not None:  # 1 on the wide columns, 0 elsewhere
            nn.init.zeros_(self.skip.weight)
            with torch.no_grad():
                self.skip.weight[:, columns] = 1.0

    def forward(self, embeddings: Tensor) -> Tensor:
        """Map ``(batch, in_dim)`` embeddings to ``(batch, num_outputs)`` logits.

        Parameters
        ----------
        embeddings : Tensor
            Concatenated cut-layer embeddings.

        Returns
        -------
        Tensor
            Logits.

        Raises
        ------
        ConfigError
            If the input width is not ``in_dim``.
        """
        check_embeddings(embeddings, self.in_dim)
        logits = self.mlp(embeddings)
        if self.skip is None:
            return logits
        return logits + self.skip(embeddings)
