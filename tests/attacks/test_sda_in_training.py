"""The in-training SDA of every epoch is the closed form of its mechanism.

A 2-epoch run's per-epoch audit scores each sample's label coordinate (its
likelihood-ratio statistic, :mod:`tpsl_flwr.attacks.sda`) against the top
model of the step that sent it. The noise is drawn once per label, so the
attacker's optimum is the same in both epochs: Laplace's
``1 - (2 + eps) e^-eps / 4``. Each run's audit scores all of its ~8,000
training rows; the tolerance is 2 of their Hanley-McNeil standard errors
(0.014 at eps 1, 0.005 at eps 4), the fixed noise seeds as measured in
``docs/attacks.md``.
"""

import json

import pytest

from tpsl_flwr.cli.main import main
from tpsl_flwr.privacy.closed_forms import sda_auc_laplace
from tpsl_flwr.testing import write_criteo

pytestmark = pytest.mark.slow

EPSILONS = (1.0, 2.0, 4.0)
ROWS = 10_000


@pytest.fixture(scope="module")
def criteo_dir(tmp_path_factory):
    """A folder holding ``train.txt``: a generated Criteo-format file of 10,000
    rows (about 24% clicks)."""
    folder = tmp_path_factory.mktemp("criteo")
    write_criteo(folder / "train.txt", ROWS, seed=7)
    return folder


def _history(out, data_flags, epsilon):
    code = main(
        [
            "simulate",
            *data_flags,
            "--mechanism",
            "laplace",
            "--epsilon",
            str(epsilon),
            "--epochs",
            "2",
            "--noise-seed",
            "11",
            "--no-checkpoint",
            "--out-dir",
            str(out),
        ]
    )
    assert code == 0
    return json.loads((out / "results.json").read_text())["history"]


def _assert_every_epoch_at_the_closed_form(history, epsilon):
    expected = sda_auc_laplace(epsilon)
    assert len(history) == 2
    for entry in history:
        attack = entry["attack_auc"]
        assert attack["sample"]["complete"]
        se = attack["standard_error"]["sda"]
        print(  # the numbers of docs/attacks.md (pytest -rA shows them)
            f"eps {epsilon:g} epoch {entry['epoch']}: SDA {attack['sda']:.4f} "
            f"± {se:.4f}, sda_pooled {attack['sda_pooled']:.4f}, closed form "
            f"{expected:.4f} ({(attack['sda'] - expected) / se:+.2f} SE), "
            f"{attack['samples']} rows"
        )
        assert abs(attack["sda"] - expected) <= 2 * se, (
            f"epoch {entry['epoch']}: SDA {attack['sda']:.4f} against the closed "
            f"form {expected:.4f} (SE {se:.4f})"
        )
        assert attack["direction"]["sda"] == "as scored"


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_criteo_file_every_epoch_matches_the_closed_form(
    tmp_path, criteo_dir, epsilon, monkeypatch
):
    # The data path is part of what the seeded key is derived from: a relative
    # one keeps the noise, and so the measured AUCs, the same on every machine.
    monkeypatch.chdir(criteo_dir)
    history = _history(
        tmp_path, ["--dataset", "criteo", "--data-path", "train.txt"], epsilon
    )
    _assert_every_epoch_at_the_closed_form(history, epsilon)


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_synthetic_ctr_every_epoch_matches_the_closed_form(tmp_path, epsilon):
    history = _history(
        tmp_path, ["--dataset", "synthetic-ctr", "--rows", str(ROWS)], epsilon
    )
    _assert_every_epoch_at_the_closed_form(history, epsilon)
