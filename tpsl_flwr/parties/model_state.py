"""Loading a party's model state from its checkpoint, a mismatch refused in one line.

A resumed run rebuilds every model from its run config, then loads the
checkpoint's tensors; a run config that shapes the model differently (another
``model``, ``embedding-dim``, hidden width, ``wide`` or number of parties) would
otherwise surface as torch's multi-line ``state_dict`` error.
"""

from __future__ import annotations

from torch import nn

from tpsl_flwr.errors import ConfigError

__all__ = ["load_checkpoint_state"]


def load_checkpoint_state(module: nn.Module, state: dict, what: str) -> None:
    """``module.load_state_dict(state)``, a mismatch refused in one line.

    Raises
    ------
    ConfigError
        If the checkpoint's tensors do not fit ``module`` (it was written by a
        run with another model), naming ``what`` and the settings that shape it.
    """
    try:
        module.load_state_dict(state)
    except RuntimeError as err:
        detail = " ".join(str(err).split())
        raise ConfigError(
            f"the checkpoint's {what} does not fit this run's: resume with the "
            "settings it was written with (model, embedding-dim, bottom-hidden, "
            f"top-hidden, wide, num-parties); {detail[:300]}"
        ) from err
