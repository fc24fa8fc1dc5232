"""The example's own bottom and top models (plain torch, no tpsl-flwr model).

Any ``nn.Module`` works as long as it keeps the two contracts
(``docs/embedding.md``): a bottom model is called as ``f(numeric,
categorical) -> (n, embedding_dim)`` with a float32 ``(n, c)`` and an int64
``(n, m)`` tensor (either may have 0 columns), and the top model maps the
concatenated embeddings ``(n, sum of the parties' widths)`` to ``(n, k)``
logits for ``k`` classes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn


class MixedBottom(nn.Module):
    """Numeric columns as they are, each categorical column through an embedding.

    Parameters
    ----------
    num_numeric
        Numeric columns (0 for a categorical-only party).
    cardinalities
        Categories of each categorical column (empty for a numeric-only party).
    category_dim
        Width of each categorical column's embedding.
    hidden
        Width of the hidden layer.
    out_dim
        Width of this party's slice of the cut layer.
    seed
        Seed of the initial parameters (public).
    """

    def __init__(
        self,
        num_numeric: int,
        cardinalities: Sequence[int],
        *,
        category_dim: int,
        hidden: int,
        out_dim: int,
        seed: int,
    ) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.embeddings = nn.ModuleList(
                nn.Embedding(k, category_dim) for k in cardinalities
            )
            width = num_numeric + category_dim * len(cardinalities)
            self.net = nn.Sequential(
                nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, out_dim)
            )

    def forward(self, numeric: Tensor, categorical: Tensor) -> Tensor:
        """``(n, out_dim)`` embeddings of ``n`` rows."""
        parts = [numeric]
        parts += [emb(categorical[:, j]) for j, emb in enumerate(self.embeddings)]
        return self.net(torch.cat(parts, dim=1))


class ConcatTop(nn.Module):
    """The label party's model over the concatenated embeddings.

    ``in_dim`` is read by the strategy's connect-time check (the nodes' widths
    must add up to it).
    """

    def __init__(self, in_dim: int, *, hidden: int, num_classes: int, seed: int):
        super().__init__()
        self.in_dim = in_dim
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.net = nn.Sequential(
                nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, num_classes)
            )

    def forward(self, embeddings: Tensor) -> Tensor:
        """``(n, num_classes)`` logits."""
        return self.net(embeddings)
