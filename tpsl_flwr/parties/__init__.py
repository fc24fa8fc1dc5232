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

Modules: :mod:`~tpsl_flwr.parties.label_party`,
:mod:`~tpsl_flwr.parties.non_label_party`, :mod:`~tpsl_flwr.parties.optim`,
:mod:`~tpsl_flwr.parties.ftrl` (the wide part's FTRL-proximal).
"""

from tpsl_flwr.parties.label_party import NOISE_CACHE_BYTES, LabelParty, noise_stream
from tpsl_flwr.parties.non_label_party import NonLabelParty
from tpsl_flwr.parties.optim import OptimizerFactory, adam

__all__ = [
    "NOISE_CACHE_BYTES",
    "LabelParty",
    "NonLabelParty",
    "OptimizerFactory",
    "adam",
    "noise_stream",
]
