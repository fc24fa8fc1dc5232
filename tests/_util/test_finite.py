"""``all_finite`` answers exactly as ``torch.isfinite(t).all()``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tpsl_flwr._util.finite import all_finite


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_all_finite_agrees_with_the_elementwise_check(dtype) -> None:
    rng = np.random.default_rng(0)
    big = torch.finfo(dtype).max
    bad_values = [float("nan"), float("inf"), float("-inf")]
    for trial in range(400):
        shape = (int(rng.integers(1, 40)), int(rng.integers(1, 40)))
        scale = big / 4 if trial % 4 == 0 else 1.0  # a quarter of them overflow
        tensor = torch.as_tensor(rng.uniform(-1, 1, shape) * scale).to(dtype)
        for _ in range(int(rng.integers(0, 3))):  # 0, 1 or 2 bad elements
            row, col = rng.integers(0, shape[0]), rng.integers(0, shape[1])
            tensor[row, col] = bad_values[int(rng.integers(0, 3))]
        assert all_finite(tensor) == bool(torch.isfinite(tensor).all())


def test_all_finite_on_the_cases_a_sum_gets_wrong() -> None:
    huge = torch.full((8,), 3e38)  # finite elements whose float32 sum overflows
    assert not torch.isfinite(huge.sum()) and all_finite(huge)
    assert not all_finite(torch.tensor([float("inf"), float("-inf")]))  # sum: NaN
    assert not all_finite(torch.tensor([3e38, 3e38, float("inf")]))
    assert all_finite(torch.empty(0, 5))
    assert all_finite(torch.arange(10))  # integers are always finite
    weights = torch.ones(3, requires_grad=True)
    assert all_finite(weights) and weights.grad is None
