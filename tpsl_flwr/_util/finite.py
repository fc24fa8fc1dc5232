"""A fast, exact check that a tensor holds no NaN or infinity.

Every party checks what crosses the cut before using it (fail closed: the
label party refuses non-finite embeddings and never sends a non-finite
gradient; a node refuses a non-finite gradient). ``torch.isfinite(t).all()``
costs ~0.23 ms on CPU for one Criteo batch's (1024, 104) gradient at one torch
thread, some 25 times a sum of the same tensor, and it ran several times a
step. :func:`all_finite` answers the same question from the sum first.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["all_finite"]


def all_finite(tensor: Tensor) -> bool:
    """Whether every element of ``tensor`` is finite (exactly ``isfinite().all()``).

    A NaN or infinite element makes a floating-point sum NaN or infinite,
    whatever the order of the additions (``inf + x = inf``, ``inf - inf = NaN``,
    ``NaN + x = NaN``), so a finite sum proves every element finite. A
    non-finite sum comes from such an element or from an overflow of finite
    ones; only then are the elements checked one by one.

    Examples
    --------
    >>> all_finite(torch.tensor([1.0, 2.0]))
    True
    >>> all_finite(torch.tensor([1.0, float("nan")]))
    False
    >>> all_finite(torch.full((4,), 3e38))  # the sum overflows; the elements do not
    True
    """
    with torch.no_grad():
        if bool(torch.isfinite(tensor.sum())):
            return True
        return bool(torch.isfinite(tensor).all())
