"""tpsl-flwr: Transcript Private Split Learning (TPSL) on Flower.

Label differential privacy for vertical split learning: the label party perturbs
the gradients it sends to the non-label parties with GradPerturb (Laplace or
randomized-response noise in the direction ``g_0 - g_1``), so the whole training
transcript is ``(epsilon, 0)``-DP for each label (Yang et al., "Differentially
Private Label Protection in Split Learning", Lemma 4.1).

The core modules (mechanisms, keyed noise, accounting, attacks, parties) import
neither Flower nor each other's heavy dependencies needlessly; Flower lives in
:mod:`tpsl_flwr.strategies` and :mod:`tpsl_flwr.simulations`.

The embedding surface is here too (``docs/embedding.md``): a ServerApp builds
its label party with ``TPSLStrategy.for_labels(...)`` and writes its run folder
with ``run_in_folder``; a ClientApp is ``make_client_app(factory)`` over
``NonLabelParty`` objects.
"""

from typing import TYPE_CHECKING, Any

from tpsl_flwr.errors import ConfigError, PrivacyError, ProtocolError, TPSLError

if TYPE_CHECKING:
    from tpsl_flwr.experiments.run_folder import run_in_folder
    from tpsl_flwr.label_store import LabelStore
    from tpsl_flwr.parties import NonLabelParty, adam
    from tpsl_flwr.privacy.keyed_noise import NoiseKey
    from tpsl_flwr.privacy.mechanisms import MECHANISMS, Mechanism, make_mechanism
    from tpsl_flwr.strategies import TPSLResult, TPSLStrategy
    from tpsl_flwr.wire.client_app import make_client_app

# Every other name is imported on first use: the mechanisms pull in
# dp-accounting and scipy (~1 s), the strategy Flower's ServerApp side, neither
# of which a node's per-message ClientApp process needs.
_LAZY = {
    "NoiseKey": "tpsl_flwr.privacy.keyed_noise",
    "MECHANISMS": "tpsl_flwr.privacy.mechanisms",
    "Mechanism": "tpsl_flwr.privacy.mechanisms",
    "make_mechanism": "tpsl_flwr.privacy.mechanisms",
    # The embedding surface (docs/embedding.md).
    "TPSLStrategy": "tpsl_flwr.strategies",
    "TPSLResult": "tpsl_flwr.strategies",
    "LabelStore": "tpsl_flwr.label_store",
    "NonLabelParty": "tpsl_flwr.parties",
    "adam": "tpsl_flwr.parties",
    "make_client_app": "tpsl_flwr.wire.client_app",
    "run_in_folder": "tpsl_flwr.experiments.run_folder",
}


def __getattr__(name: str) -> Any:
    """The lazy names of ``__all__``, imported on first access."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "MECHANISMS",
    "ConfigError",
    "LabelStore",
    "Mechanism",
    "NoiseKey",
    "NonLabelParty",
    "PrivacyError",
    "ProtocolError",
    "TPSLError",
    "TPSLResult",
    "TPSLStrategy",
    "adam",
    "make_client_app",
    "make_mechanism",
    "run_in_folder",
]

__version__ = "0.1.0"
