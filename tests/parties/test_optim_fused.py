"""The parties' Adam(W) is torch's fused kernel: the same update, one pass per group."""

from __future__ import annotations

import pytest
import torch

from tpsl_flwr.parties.optim import adam


def _params(seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.nn.Parameter(torch.randn(512, 8, generator=g)),
        torch.nn.Parameter(torch.randn(8, generator=g)),
    ]


@pytest.mark.parametrize("weight_decay", [0.0, 0.3])
def test_fused_update_equals_the_per_tensor_loop(weight_decay: float) -> None:
    # Prepare: the same weights and gradients for both optimizers
    fused_params, loop_params = _params(0), _params(0)
    fused = adam(1e-2, weight_decay)(fused_params)
    cls = torch.optim.AdamW if weight_decay else torch.optim.Adam
    loop = cls(loop_params, lr=1e-2, weight_decay=weight_decay, foreach=False)
    g = torch.Generator().manual_seed(1)
    # Execute: 20 steps on random gradients
    for _ in range(20):
        for a, b in zip(fused_params, loop_params, strict=True):
            a.grad = torch.randn(a.shape, generator=g)
            b.grad = a.grad.clone()
        fused.step()
        loop.step()
    # Assert: fused, and the weights agree to float rounding
    assert fused.defaults["fused"] is True
    assert isinstance(fused, cls)
    for a, b in zip(fused_params, loop_params, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert not torch.equal(a, _params(0)[0] if a.dim() == 2 else _params(0)[1])


def test_unfusable_parameters_keep_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: a torch that refuses to fuse these parameters
    real = torch.optim.Adam

    def refuse(params, **kwargs):  # type: ignore[no-untyped-def]
        if kwargs.get("fused"):
            raise RuntimeError("`fused=True` requires all the params to be ...")
        return real(params, **kwargs)

    monkeypatch.setattr(torch.optim, "Adam", refuse)
    # Execute
    opt = adam(1e-3)(iter(_params(0)))
    # Assert: a working optimizer over every parameter (the iterator read once)
    assert not opt.defaults.get("fused")
    assert sum(len(group["params"]) for group in opt.param_groups) == 2
