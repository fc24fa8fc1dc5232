"""tpsl-flwr: Transcript Private Split Learning (TPSL) on Flower.

Label differential privacy for vertical split learning: the label party perturbs
the gradients it sends to the non-label parties with GradPerturb (Laplace or
randomized-response noise in the direction ``g_0 - g_1``), so the whole training
transcript is ``(epsilon, 0)``-DP for each label (Yang et al., "Differentially
Private Label Protection in Split Learning", Lemma 4.1).

The core packages (``_util``, ``privacy``, ``metrics``, ``data``, ``models``,
``release``, ``attacks``, ``parties``, ``validation``) import no Flower;
Flower lives in ``wire``, ``strategies``, ``engines``, ``experiments``,
``simulations`` and ``cli`` (``docs/layout.md`` gives the order).

The embedding surface is here too (``docs/embedding.md``): a ServerApp builds
its label party with ``TPSLStrategy.for_labels(...)`` and writes its run folder
with ``run_in_folder``; a ClientApp is ``make_client_app(factory)`` over
``NonLabelParty`` objects.

Module paths of the previous layout (``tpsl_flwr.label_store``,
``tpsl_flwr.wire.client_app``, ...) still import, for one release, with a
:class:`DeprecationWarning` naming the new path (:data:`MOVED`).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tpsl_flwr.errors import ConfigError, PrivacyError, ProtocolError, TPSLError

if TYPE_CHECKING:
    from tpsl_flwr.experiments.run_folder import run_in_folder
    from tpsl_flwr.parties import NonLabelParty, adam
    from tpsl_flwr.privacy.keyed_noise import NoiseKey
    from tpsl_flwr.privacy.mechanisms import MECHANISMS, Mechanism, make_mechanism
    from tpsl_flwr.release.store import LabelStore
    from tpsl_flwr.strategies import TPSLResult, TPSLStrategy
    from tpsl_flwr.wire.node_side import make_client_app

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
    "LabelStore": "tpsl_flwr.release.store",
    "NonLabelParty": "tpsl_flwr.parties",
    "adam": "tpsl_flwr.parties",
    "make_client_app": "tpsl_flwr.wire.node_side",
    "run_in_folder": "tpsl_flwr.experiments.run_folder",
}

MOVED: dict[str, str] = {
    "tpsl_flwr.auc": "tpsl_flwr.metrics.auc",
    "tpsl_flwr.compact_ints": "tpsl_flwr._util.compact_ints",
    "tpsl_flwr.engines.allocator": "tpsl_flwr._util.allocator",
    "tpsl_flwr.engines.certificates": "tpsl_flwr.engines.deployment.certificates",
    "tpsl_flwr.engines.deployment_faults": "tpsl_flwr.engines.deployment.faults",
    "tpsl_flwr.engines.deployment_security": "tpsl_flwr.engines.deployment.security",
    "tpsl_flwr.engines.fleet_proxy": "tpsl_flwr.engines.deployment.fleet_proxy",
    "tpsl_flwr.engines.flower_run": "tpsl_flwr.experiments.ray_run",
    "tpsl_flwr.evaluation": "tpsl_flwr.metrics.evaluation",
    "tpsl_flwr.experiments.sweep_axes": "tpsl_flwr.experiments.sweep.axes",
    "tpsl_flwr.experiments.sweep_config": "tpsl_flwr.experiments.sweep.config",
    "tpsl_flwr.experiments.sweep_pairs": "tpsl_flwr.experiments.sweep.pairs",
    "tpsl_flwr.experiments.sweep_report": "tpsl_flwr.experiments.sweep.report",
    "tpsl_flwr.experiments.sweep_scale": "tpsl_flwr.experiments.sweep.scale",
    "tpsl_flwr.experiments.sweep_stats": "tpsl_flwr.experiments.sweep.stats",
    "tpsl_flwr.experiments.validation_settings": "tpsl_flwr.validation.holdout",
    "tpsl_flwr.finite": "tpsl_flwr._util.finite",
    "tpsl_flwr.interaction": "tpsl_flwr.models.interaction",
    "tpsl_flwr.label_set": "tpsl_flwr.release.label_set",
    "tpsl_flwr.label_store": "tpsl_flwr.release.store",
    "tpsl_flwr.ledger": "tpsl_flwr.release.ledger",
    "tpsl_flwr.noise_binding": "tpsl_flwr.release.binding",
    "tpsl_flwr.outputs": "tpsl_flwr.models.outputs",
    "tpsl_flwr.private_files": "tpsl_flwr._util.private_files",
    "tpsl_flwr.privacy.label_noise": "tpsl_flwr.privacy.mechanisms.base",
    "tpsl_flwr.release_record": "tpsl_flwr.release.record",
    "tpsl_flwr.simulations.cli": "tpsl_flwr.cli.main",
    "tpsl_flwr.simulations.cli_commands": "tpsl_flwr.cli.output",
    "tpsl_flwr.simulations.cli_flags": "tpsl_flwr.cli.flags",
    "tpsl_flwr.simulations.cli_ledger": "tpsl_flwr.cli.ledger",
    "tpsl_flwr.strategies.noise_margin": "tpsl_flwr.validation.noise_margin",
    "tpsl_flwr.strategies.selection": "tpsl_flwr.validation.best_epoch",
    "tpsl_flwr.wire.client_app": "tpsl_flwr.wire.node_side",
}
"""Module paths of the previous layout and where each module lives now.

Importing an old path imports the new module under both names and warns
once (:class:`DeprecationWarning`); they go in the release after next.
"""


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Import an old module path of :data:`MOVED` as its new module, and warn.

    ``sys.modules`` then holds the one module object under both names, so
    ``from tpsl_flwr.label_store import LabelStore`` gives the very class
    ``tpsl_flwr.release.store`` defines (and monkeypatching either name
    reaches both).
    """

    def find_spec(
        self, fullname: str, path: Any = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        """A spec for an old path of :data:`MOVED`; None for anything else."""
        if fullname not in MOVED:
            return None
        warnings.warn(
            f"{fullname} moved to {MOVED[fullname]}; the old path goes in the "
            "release after next",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        """The new module itself (imported if need be)."""
        module = importlib.import_module(MOVED[spec.name])
        spec.loader_state = module.__spec__  # the import system overwrites it
        return module

    def get_code(self, fullname: str) -> Any:
        """The new module's code (``python -m`` of an old path runs it)."""
        spec = importlib.util.find_spec(MOVED[fullname])
        loader = None if spec is None else spec.loader
        return None if loader is None else loader.get_code(MOVED[fullname])  # type: ignore[attr-defined]

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run; give the module back its own spec and loader."""
        alias = module.__spec__
        own = None if alias is None else alias.loader_state
        if own is not None:
            module.__spec__ = own
            module.__loader__ = own.loader


if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedModuleFinder())


def __getattr__(name: str) -> Any:
    """The lazy names of ``__all__`` and the moved root modules, on first use."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if f"{__name__}.{name}" in MOVED:
        return importlib.import_module(f"{__name__}.{name}")
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
