"""tpsl-flwr: Transcript Private Split Learning (TPSL) on Flower.

Label differential privacy for vertical split learning: the label party perturbs
the gradients it sends to the non-label parties with GradPerturb (Laplace or
randomized-response noise in the direction ``g_0 - g_1``), so the whole training
transcript is ``(epsilon, 0)``-DP for each label (Yang et al., "Differentially
Private Label Protection in Split Learning", Lemma 4.1).

The core modules (mechanisms, keyed noise, accounting, attacks, parties) import
neither Flower nor each other's heavy dependencies needlessly; Flower lives in
:mod:`tpsl_flwr.strategies` and :mod:`tpsl_flwr.simulations`.
"""

from tpsl_flwr.errors import ConfigError, PrivacyError, ProtocolError, TPSLError
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms import MECHANISMS, Mechanism, make_mechanism

__all__ = [
    "MECHANISMS",
    "ConfigError",
    "Mechanism",
    "NoiseKey",
    "PrivacyError",
    "ProtocolError",
    "TPSLError",
    "make_mechanism",
]

__version__ = "0.1.0"
