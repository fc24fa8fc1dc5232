"""The tail average of a party's weights: its mean, its rule, its refusals."""

import pytest
import torch

from tpsl_flwr import ConfigError
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.parties.weight_average import (
    average_mode,
    average_start,
    fold_average,
    resolve_average,
)


def test_the_folded_average_is_the_mean_of_the_snapshots():
    # Prepare: five snapshots of a model's weights, and an integer buffer
    generator = torch.Generator().manual_seed(0)
    snapshots = [
        {
            "w": torch.randn(3, 4, generator=generator),
            "b": torch.randn(4, generator=generator, dtype=torch.float64),
            "steps": torch.tensor(k),
        }
        for k in range(5)
    ]
    # Execute
    average = None
    for count, snapshot in enumerate(snapshots):
        average = fold_average(average, snapshot, count)
    # Assert: float tensors are the mean (float32 rounding), in their own dtype;
    # the integer buffer is the latest snapshot's
    assert average is not None
    mean_w = torch.stack([s["w"] for s in snapshots]).mean(0)
    mean_b = torch.stack([s["b"] for s in snapshots]).mean(0)
    torch.testing.assert_close(average["w"], mean_w, rtol=0, atol=1e-6)
    torch.testing.assert_close(average["b"], mean_b, rtol=0, atol=1e-12)
    assert average["w"].dtype == torch.float32
    assert average["b"].dtype == torch.float64
    assert int(average["steps"]) == 4


def test_the_average_does_not_alias_the_live_weights():
    weights = {"w": torch.zeros(2)}
    average = fold_average(None, weights, 0)
    weights["w"].add_(1.0)
    assert float(average["w"].sum()) == 0.0


def test_a_mismatched_snapshot_or_count_is_refused_by_name():
    first = fold_average(None, {"w": torch.zeros(2)}, 0)
    with pytest.raises(ConfigError, match="w: weights of shape"):
        fold_average(first, {"w": torch.zeros(3)}, 1)
    with pytest.raises(ConfigError, match=r"do not match .*'v'"):
        fold_average(first, {"v": torch.zeros(2)}, 1)
    with pytest.raises(ConfigError, match="running average of 2 snapshots"):
        fold_average(None, {"w": torch.zeros(2)}, 2)
    with pytest.raises(ConfigError, match="running average of 0 snapshots"):
        fold_average(first, {"w": torch.zeros(2)}, 0)


@pytest.mark.parametrize(
    ("average", "epochs", "held_out", "start"),
    [
        ("auto", 1, False, None),
        ("auto", 2, False, None),  # nothing to average a 2-epoch run over
        ("auto", 3, False, None),  # still learning: nothing gained at 3
        ("auto", 5, False, 1),
        ("auto", 8, False, 1),
        ("auto", 16, False, 1),
        ("auto", 8, True, None),  # the hold-out restores its best epoch
        ("on", 2, False, 1),
        ("on", 1, False, 0),
        ("off", 8, False, None),
        (True, 5, False, 1),
        ("false", 8, False, None),
    ],
)
def test_the_rule_from_public_facts(average, epochs, held_out, start):
    assert resolve_average(average, epochs=epochs, held_out=held_out) == start


def test_auto_does_not_average_a_run_the_epoch_budget_leaves_still_learning():
    # still_learning: the model improves to its last epoch; averaging from
    # epoch 2 would take in under-trained weights (Criteo 2k, noisy labels)
    assert (
        resolve_average("auto", epochs=8, held_out=False, still_learning=True) is None
    )
    assert resolve_average("auto", epochs=8, held_out=False, still_learning=False) == 1
    assert resolve_average("on", epochs=8, held_out=False, still_learning=True) == 1


def test_every_epoch_after_the_first_is_averaged():
    assert [e - average_start(e) for e in (1, 2, 3, 8, 16)] == [1, 1, 2, 7, 15]


def test_on_beside_a_hold_out_and_unknown_values_are_refused():
    with pytest.raises(ConfigError, match="validation-fraction = 0"):
        resolve_average("on", epochs=8, held_out=True)
    with pytest.raises(ConfigError, match=r"average must be one of .* got 'mean'"):
        average_mode("mean")
    with pytest.raises(ConfigError, match=r"validation-fraction = 0\.1"):
        ExperimentConfig(average="on", validation_fraction=0.1)
    assert ExperimentConfig(average=True).average == "on"
    assert ExperimentConfig().average == "auto"
