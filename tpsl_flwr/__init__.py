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

from typing import Any

from tpsl_flwr.errors import ConfigError, PrivacyError, ProtocolError, TPSLError

# The privacy names are imported on first use: the mechanisms pull in
# dp-accounting and scipy (~1 s), which a node's per-message ClientApp process
# (tpsl_flwr.simulations.client_app) never needs.
_LAZY = {
    "NoiseKey": "tpsl_flwr.privacy.keyed_noise",
    "MECHANISMS": "tpsl_flwr.privacy.mechanisms",
    "Mechanism": "tpsl_flwr.privacy.mechanisms",
    "make_mechanism": "tpsl_flwr.privacy.mechanisms",
}


def __getattr__(name: str) -> Any:
    """The privacy names of ``__all__``, imported on first access."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
