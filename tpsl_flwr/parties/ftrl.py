"""FTRL-proximal: the per-coordinate, L1/L2-regularized optimizer of a wide part.

McMahan et al., "Ad Click Prediction: a View from the Trenches", KDD 2013,
Algorithm 1 (per-coordinate FTRL-proximal with L1 and L2 regularization), the
optimizer Wide & Deep trains its wide part with (Cheng et al., DLRS 2016). Per
coordinate ``i``, with gradient ``g``, learning rate ``alpha`` and its
accumulators ``z`` and ``n`` (both 0 at the start):

* ``sigma = 1/eta_new - 1/eta_old``, ``1/eta = (beta + sqrt(n)) / alpha``;
* ``z += g - sigma * w``, ``n += g^2``;
* ``w = 0`` if ``|z| <= l1``, else ``-(z - sign(z) * l1) / (1/eta + l2)``.

A coordinate whose gradient is 0 (a category absent from the batch) keeps its
weight: ``sigma * w`` moves ``z`` exactly to where the closed form returns the
same ``w`` (up to rounding). The L1 term sets a weight to exactly 0 until its
summed gradient exceeds ``l1``: a category seen rarely keeps no weight.

**A learning-rate schedule** (:func:`~tpsl_flwr.parties.optim.set_lr_scale`)
scales ``alpha`` step by step, and ``eta`` with it. Algorithm 1 holds
``alpha`` fixed; with a decaying one ``sigma`` includes the decay, so the
proximal term holds the weights where they are (they freeze, as under a
decayed gradient step) instead of the closed form shrinking them towards 0.
A step with learning rate 0 changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

from tpsl_flwr.errors import ConfigError

__all__ = ["FtrlProximal", "ftrl"]


class FtrlProximal(torch.optim.Optimizer):
    """Per-coordinate FTRL-proximal with L1 and L2 (McMahan et al. 2013, Alg. 1).

    Parameters
    ----------
    params
        Parameters (or parameter groups) to optimize.
    lr : float
        ``alpha``, > 0: the per-coordinate learning rate is
        ``alpha / (beta + sqrt(sum of squared gradients))``.
    beta : float
        >= 0; the paper's default 1 suits gradients of order 1. The gradients
        of a batch's mean loss are smaller; the rate's start is ``alpha / beta``.
    l1, l2 : float
        >= 0: the L1 and (half the) L2 penalty, ``l1 * |w| + l2 / 2 * w^2``,
        in the units of the summed gradients.

    Raises
    ------
    ConfigError
        If a setting is out of range (the message names it and its value).

    Examples
    --------
    One coordinate, a constant gradient of 1, ``l1 = 2.5``: the weight stays
    exactly 0 until the summed gradient (3) passes ``l1``.

    >>> w = torch.zeros(1, requires_grad=True)
    >>> opt = FtrlProximal([w], lr=1.0, beta=1.0, l1=2.5)
    >>> for _ in range(3):
    ...     w.grad = torch.ones(1)
    ...     opt.step()
    ...     print(round(w.item(), 4))
    0.0
    0.0
    -0.183
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 0.1,
        *,
        beta: float = 1.0,
        l1: float = 0.0,
        l2: float = 0.0,
    ) -> None:
        _check("lr", lr, positive=True)
        for name, value in (("beta", beta), ("l1", l1), ("l2", l2)):
            _check(name, value, positive=False)
        super().__init__(params, {"lr": lr, "beta": beta, "l1": l1, "l2": l2})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One FTRL-proximal update of every parameter that has a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            alpha, beta = float(group["lr"]), float(group["beta"])
            l1, l2 = float(group["l1"]), float(group["l2"])
            if alpha <= 0:  # a learning rate of 0: nothing moves
                continue
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise ConfigError("FtrlProximal takes dense gradients")
                self._update(p, p.grad, alpha, beta, l1, l2)
        return loss

    def _update(
        self,
        p: torch.Tensor,
        g: torch.Tensor,
        alpha: float,
        beta: float,
        l1: float,
        l2: float,
    ) -> None:
        state = self.state[p]
        if not state:  # z such that the closed form returns the current p
            state["z"] = -(beta / alpha + l2) * p - l1 * torch.sign(p)
            state["n"] = torch.zeros_like(p)
            state["lr"] = alpha
        z, n = state["z"], state["n"]
        inv_eta_old = (beta + n.sqrt()) / float(state["lr"])
        n.add_(g * g)
        inv_eta = (beta + n.sqrt()) / alpha
        z.add_(g - (inv_eta - inv_eta_old) * p)
        state["lr"] = alpha
        shrunk = z - torch.sign(z) * l1
        denominator = inv_eta + l2
        # 1/eta is 0 only where beta = 0 and no gradient came yet (w stays 0)
        new = torch.where(
            (z.abs() > l1) & (denominator > 0),
            -shrunk / denominator.clamp_min(torch.finfo(p.dtype).tiny),
            torch.zeros_like(p),
        )
        p.copy_(new)


def ftrl(
    lr: float, *, beta: float = 1.0, l1: float = 0.0, l2: float = 0.0
) -> Callable[[Any], torch.optim.Optimizer]:
    """An optimizer factory: :class:`FtrlProximal` with these settings.

    The settings are checked here, before any model exists.
    """
    _check("lr", lr, positive=True)
    for name, value in (("beta", beta), ("l1", l1), ("l2", l2)):
        _check(name, value, positive=False)
    return lambda params: FtrlProximal(params, lr=lr, beta=beta, l1=l1, l2=l2)


def _check(name: str, value: object, *, positive: bool) -> None:
    """Raise unless ``value`` is a finite number, > 0 (``positive``) or >= 0."""
    ok = (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and (value > 0 if positive else value >= 0)
    )
    if not ok:
        bound = "> 0" if positive else ">= 0"
        raise ConfigError(f"ftrl {name} must be {bound} and finite, got {value!r}")
