"""The wide part's own optimizer: FTRL-proximal, its checkpoint, its run config.

Golden values of FTRL-proximal on 1-D problems (McMahan et al. 2013, Algorithm
1), the L1 threshold (weights exactly 0 below it), the state through the node's
checkpoint codec (a resumed node continues bit for bit), and a run end to end.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Context, Message

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.run import run_inprocess_experiment
from tpsl_flwr.models import BottomModel
from tpsl_flwr.parties import NonLabelParty, adam
from tpsl_flwr.parties.ftrl import FtrlProximal, ftrl
from tpsl_flwr.parties.optim import set_lr_scale
from tpsl_flwr.simulations.client_app import builtin_checkpoint_dir, builtin_party
from tpsl_flwr.wire import protocol as P
from tpsl_flwr.wire.batch_pack import gradient_batches
from tpsl_flwr.wire.node_side import make_client_app
from tpsl_flwr.wire.state_codec import decode_state, encode_state


def _steps(opt: FtrlProximal, w: torch.Tensor, grads: list[float]) -> list[float]:
    """Apply the gradients one step each; the weight after every step."""
    out = []
    for g in grads:
        w.grad = torch.full_like(w, g)
        opt.step()
        out.append(float(w.item()))
    return out


# ------------------------------------------------------------ the optimizer
@pytest.mark.parametrize("alpha, beta, g", [(0.5, 1.0, 0.3), (2.0, 0.1, -1.5)])
def test_without_penalties_ftrl_is_per_coordinate_adaptive_gradient_descent(
    alpha, beta, g
):
    # Prepare: a constant gradient g, no L1/L2: w_T = -g sum_s alpha/(beta+sqrt(s)|g|)
    w = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = FtrlProximal([w], lr=alpha, beta=beta)

    # Execute
    got = _steps(opt, w, [g] * 6)

    # Assert
    want = [
        -g * sum(alpha / (beta + math.sqrt(s) * abs(g)) for s in range(1, t + 1))
        for t in range(1, 7)
    ]
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_l1_keeps_the_weight_exactly_0_until_the_summed_gradient_passes_it():
    # Prepare: gradient 0.4 per step, l1 = 1.0: |z| = 0.4 t passes 1 at t = 3
    alpha, beta, l1, l2, g = 0.5, 1.0, 1.0, 0.2, 0.4
    w = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = FtrlProximal([w], lr=alpha, beta=beta, l1=l1, l2=l2)

    # Execute
    got = _steps(opt, w, [g] * 3)

    # Assert: exactly 0 twice, then the closed form at z = 3 g, n = 3 g^2
    assert got[:2] == [0.0, 0.0]
    want = -(3 * g - l1) / ((beta + math.sqrt(3) * g) / alpha + l2)
    assert got[2] == pytest.approx(want, rel=1e-12)
    assert got[2] < 0


def test_l2_shrinks_the_first_step_by_its_closed_form():
    w = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = FtrlProximal([w], lr=0.3, beta=0.5, l2=2.0)
    (got,) = _steps(opt, w, [-0.8])
    assert got == pytest.approx(0.8 / ((0.5 + 0.8) / 0.3 + 2.0), rel=1e-12)


def test_a_coordinate_without_gradient_keeps_its_weight_under_a_decaying_rate():
    # Prepare: two coordinates trained, then only the first gets gradients
    # while the schedule decays the rate
    w = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    opt = FtrlProximal([w], lr=0.5, l1=0.1, l2=0.3)
    for _ in range(3):
        w.grad = torch.tensor([0.7, -0.9], dtype=torch.float64)
        opt.step()
    kept = float(w.detach()[1])

    # Execute
    for scale in (0.8, 0.5, 0.2):
        set_lr_scale(opt, scale)
        w.grad = torch.tensor([0.7, 0.0], dtype=torch.float64)
        opt.step()

    # Assert
    assert kept > 0 and float(w.detach()[1]) == pytest.approx(kept, rel=1e-12)


def test_a_decayed_rate_freezes_the_weights_and_rate_0_changes_nothing():
    w = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = FtrlProximal([w], lr=1.0, l2=0.5)
    _steps(opt, w, [1.0] * 4)
    before = float(w.item())
    set_lr_scale(opt, 1e-6)  # a step of rate ~0 moves the weight by ~0
    assert _steps(opt, w, [1.0])[0] == pytest.approx(before, abs=1e-5)
    set_lr_scale(opt, 0.0)
    assert _steps(opt, w, [5.0])[0] == pytest.approx(before, abs=1e-5)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"lr": 0.0}, "lr must be > 0 and finite, got 0.0"),
        ({"lr": math.inf}, "lr must be > 0 and finite, got inf"),
        ({"lr": 0.1, "l1": -1.0}, "l1 must be >= 0 and finite, got -1.0"),
        ({"lr": 0.1, "beta": math.nan}, "beta must be >= 0 and finite, got nan"),
    ],
)
def test_bad_settings_are_refused_naming_the_value(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        ftrl(**kwargs)
    with pytest.raises(ConfigError, match=match):
        FtrlProximal([torch.zeros(1, requires_grad=True)], **kwargs)


# ------------------------------------------------ the node and its checkpoint
def _party() -> NonLabelParty:
    rng = np.random.default_rng(0)
    numeric = rng.normal(size=(32, 2)).astype(np.float32)
    categorical = rng.integers(0, 5, size=(32, 3))
    bottom = BottomModel(
        2,
        [5, 5, 5],
        embedding_dim=4,
        out_dim=4,
        fields=True,
        wide=True,
        generator=torch.Generator().manual_seed(0),
    )
    return NonLabelParty(
        {"train": (numeric, categorical)},
        bottom,
        adam(1e-2, 0.1),
        wide_optimizer=ftrl(0.1, l1=1e-3, l2=0.1),
    )


def _train(party: NonLabelParty, steps: range) -> None:
    for step in steps:
        ids = np.arange(step % 4 * 8, step % 4 * 8 + 8)
        out = party.embed(ids, keep_graph=True)
        grad = torch.sin(out + step)  # any fixed function of the step
        party.set_lr_scale(0.5 * (1 + math.cos(math.pi * step / 12)))
        party.apply_gradient(ids, grad.numpy())


def test_the_wide_optimizer_owns_the_wide_part_and_the_deep_one_the_rest():
    party = _party()
    assert party.wide_optimizer is not None
    assert isinstance(party.bottom, BottomModel)
    wide = {id(p) for p in party.bottom.wide_parameters()}
    deep = {id(p) for g in party.optimizer.param_groups for p in g["params"]}
    own = {id(p) for g in party.wide_optimizer.param_groups for p in g["params"]}
    assert own == wide and not deep & wide
    assert deep | wide == {id(p) for p in party.bottom.parameters()}


def test_a_node_restored_from_its_checkpoint_continues_bit_for_bit():
    # Prepare: one party trained 12 steps; another trained 6, checkpointed
    # through the node's codec, restored into a fresh party, trained 6 more
    reference, resumed = _party(), _party()
    _train(reference, range(12))
    _train(resumed, range(6))
    header, data = encode_state(resumed.state_dict())
    restored = _party()

    # Execute
    restored.load_state_dict(decode_state(header, data))
    _train(restored, range(6, 12))

    # Assert: the same weights, and the same FTRL state (z, n)
    for a, b in zip(
        reference.bottom.state_dict().values(),
        restored.bottom.state_dict().values(),
        strict=True,
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert reference.wide_optimizer is not None
    assert restored.wide_optimizer is not None
    want = reference.wide_optimizer.state_dict()["state"]
    got = restored.wide_optimizer.state_dict()["state"]
    for key in want:
        for name in ("z", "n"):
            torch.testing.assert_close(got[key][name], want[key][name], rtol=0, atol=0)


def test_a_checkpoint_of_another_optimizer_layout_is_refused_in_one_line():
    party = _party()
    state = party.state_dict()
    del state["wide_optimizer"]
    with pytest.raises(ConfigError, match="written with no separate wide optimizer"):
        party.load_state_dict(state)


def test_a_wide_optimizer_without_a_wide_part_is_refused():
    bottom = BottomModel(2, [], out_dim=4)
    with pytest.raises(ConfigError, match="needs a bottom model with a wide part"):
        NonLabelParty(
            {"train": np.zeros((4, 2), np.float32)}, bottom, wide_optimizer=ftrl(0.1)
        )


# ----------------------------------------------------------- the run config
@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"wide": False, "wide_optimizer": "ftrl"}, "set wide = .on. or .auto."),
        ({"wide": True, "wide_optimizer": "sgd"}, "wide-optimizer must be one of"),
        ({"wide": True, "wide_lr": 0.0}, "wide-lr must be > 0 and finite, got 0.0"),
        ({"wide": True, "wide_l1": -0.1}, "wide-l1 must be >= 0 and finite"),
    ],
)
def test_bad_wide_settings_are_refused_before_any_party_starts(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        ExperimentConfig(dataset="breast-cancer", **kwargs)


WIDE: dict[str, Any] = {
    "dataset": "breast-cancer",
    "mechanism": "laplace",
    "epochs": 3,
    "batch_size": 128,
    "noise_seed": 5,
    "wide": True,
    "wide_optimizer": "ftrl",
    "wide_lr": 0.05,
    "wide_l1": 1e-3,
    "wide_l2": 0.1,
}
"""455 training rows: 4 steps per epoch, 1 hello + 3 x (4 steps + 1 query) per node."""


def _gradients(sent: list[Message], grid: Any, from_epoch: int) -> list[Any]:
    """``(partition, epoch, arrays)`` of every train message from ``from_epoch``."""
    out = []
    for msg in sent:
        raw: Any = msg.content.config_records[P.CONFIG].get(P.EPOCH, -1)
        epoch = int(raw)
        batches = gradient_batches(msg.content)
        if epoch >= from_epoch and batches:
            arrays = [a for pair in batches for a in pair]
            out.append((grid.partition_of(msg.metadata.dst_node_id), epoch, arrays))
    return sorted(out, key=lambda x: (x[0], x[1]))


def test_a_run_with_ftrl_learns_and_resumes_dispatching_the_same_gradients(
    tmp_path, one_torch_thread
):
    # Prepare: an uninterrupted run, and one whose node 1 dies in epoch 1
    sent: list[Message] = []
    results, grid = run_inprocess_experiment(
        ExperimentConfig(out_dir=str(tmp_path / "ref"), **WIDE),
        on_message=sent.append,
    )
    reference = _gradients(sent, grid, from_epoch=1)
    out_dir = str(tmp_path / "run")
    calls = {"n": 0}
    default = make_client_app(builtin_party, checkpoint_dir=builtin_checkpoint_dir)

    def app(msg: Message, context: Context) -> Message:
        if int(context.node_config[P.PARTITION_ID]) == 1:
            calls["n"] += 1  # hello + epoch 0 (5) + 2 steps of epoch 1
            if calls["n"] > 1 + 5 + 2:
                raise RuntimeError("SuperNode killed")
        return default(msg, context)

    with pytest.raises(Exception, match="SuperNode killed"):
        run_inprocess_experiment(
            ExperimentConfig(out_dir=out_dir, **WIDE), client_app=app
        )

    # Execute
    resent: list[Message] = []
    _, grid = run_inprocess_experiment(
        ExperimentConfig(out_dir=out_dir, resume=True, **WIDE),
        on_message=resent.append,
    )

    # Assert: it learns, and the resumed run sends the same gradients
    assert results["test_auc"] > 0.9
    got = _gradients(resent, grid, from_epoch=0)
    assert {epoch for _, epoch, _ in got} == {1, 2}
    assert [g[:2] for g in got] == [r[:2] for r in reference]
    for g, r in zip(got, reference, strict=True):
        for a, b in zip(g[2], r[2], strict=True):
            np.testing.assert_array_equal(a, b)
