"""Torch models of split learning: a bottom model per party and the top model.

A non-label party's :class:`BottomModel` ``f`` maps its feature slice to the
cut-layer embedding (:mod:`~tpsl_flwr.models.bottom`); the label party's
:class:`TopModel` ``h`` maps the concatenated embeddings of all parties to logits
(one for binary labels, ``k`` for ``k`` classes; see :func:`num_outputs_for`)
(:mod:`~tpsl_flwr.models.top`), or :class:`DotInteractionTop`, DLRM's pairwise
dot products of the nodes' field vectors (:mod:`~tpsl_flwr.models.interaction`).
What they share (size checks, the seeded init) is :mod:`~tpsl_flwr.models.layers`.
Plain torch: no Flower.
"""

from tpsl_flwr.models.bottom import FIELD_EMBEDDING_SD, BottomModel
from tpsl_flwr.models.interaction import DotInteractionTop
from tpsl_flwr.models.layers import EMBEDDING_SD, field_count
from tpsl_flwr.models.outputs import num_outputs_for
from tpsl_flwr.models.top import TopModel

__all__ = [
    "EMBEDDING_SD",
    "FIELD_EMBEDDING_SD",
    "BottomModel",
    "DotInteractionTop",
    "TopModel",
    "field_count",
    "num_outputs_for",
]
