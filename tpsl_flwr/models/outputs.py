"""How many logits the top model emits for a number of classes.

Binary labels take one logit (sigmoid and binary cross-entropy, so GradPerturb
works in the one direction ``g0 - g1``); ``k`` classes take ``k`` (softmax and
cross-entropy). :mod:`tpsl_flwr.models` re-exports it.
"""

from __future__ import annotations

from tpsl_flwr.errors import ConfigError

__all__ = ["num_outputs_for"]


def num_outputs_for(num_classes: int) -> int:
    """Number of logits the top model emits for ``num_classes`` classes.

    Parameters
    ----------
    num_classes : int
        At least 2.

    Returns
    -------
    int
        1 for binary labels (one logit, sigmoid + BCE), else ``num_classes``
        (softmax + cross-entropy).

    Raises
    ------
    ConfigError
        If ``num_classes`` is not an int >= 2.

    Examples
    --------
    >>> num_outputs_for(2), num_outputs_for(10)
    (1, 10)
    """
    if isinstance(num_classes, bool) or not isinstance(num_classes, int):
        raise ConfigError(f"num_classes must be an int, got {num_classes!r}")
    if num_classes < 2:
        raise ConfigError(f"num_classes must be >= 2, got {num_classes}")
    return 1 if num_classes == 2 else num_classes
