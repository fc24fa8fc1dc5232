"""True totals (issue item 7): no total is ``None`` or empty, ``inf`` is said.

A Gaussian release has no pure epsilon but an ``(eps, delta)`` one: the
ledger's total, ``tpsl-flwr ledger show``, ``results.json``, ``runs.csv``,
``tables.md`` and ``report.md`` state it, with the pure total ``inf``.
"""

import csv
import math

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import norm

from tpsl_flwr.cli.ledger import ledger_text
from tpsl_flwr.cli.output import summary_line
from tpsl_flwr.experiments.run_report import markdown
from tpsl_flwr.experiments.sweep.run import load_sweep, run_sweep
from tpsl_flwr.release.ledger import DELTA, LedgerEntry, PrivacyLedger, compose

PLD_TOLERANCE = 1e-3
"""The ledger's PLD discretization interval: its epsilon is pessimistic by at
most about this much."""


def _gaussian(sigma, placement="logits", key="g"):
    return LedgerEntry(
        key, "gaussian", "sigma", sigma, 2, placement, True, 1, 1, None, "os"
    )


def _pure(mechanism, epsilon, key):
    return LedgerEntry(
        key, mechanism, "epsilon", epsilon, 2, "logits", True, 1, 1, epsilon, "os"
    )


def gaussian_epsilon(sigma: float, delta: float) -> float:
    """The exact epsilon at ``delta`` of the Gaussian mechanism, sensitivity 1.

    ``delta(eps) = Phi(1/(2 sigma) - eps sigma) - e^eps Phi(-1/(2 sigma) -
    eps sigma)`` (Balle and Wang 2018, Theorem 8), solved for ``eps``.
    """

    def excess(eps: float) -> float:
        low = norm.cdf(-0.5 / sigma - eps * sigma)
        return norm.cdf(0.5 / sigma - eps * sigma) - math.exp(eps) * low - delta

    return float(brentq(excess, 0.0, 100.0))


# --------------------------------------------------------------- a. ledger
@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0])
def test_a_gaussian_release_is_totalled_by_the_pld_never_none(sigma):
    # Execute
    total = compose([_gaussian(sigma)])

    # Assert: no pure total (inf, not None); the (eps, delta) one is the
    # Gaussian mechanism's closed form.
    assert total.epsilon == math.inf
    expected = gaussian_epsilon(sigma, DELTA)
    assert total.epsilon_at_delta == pytest.approx(expected, abs=PLD_TOLERANCE)
    assert total.to_dict()["epsilon"] == "inf"
    assert None not in total.to_dict().values()


def test_two_gaussian_releases_compose_as_one_with_sigma_over_root_two():
    # Two independent N(0, 2^2) releases = one with sigma 2 / sqrt(2).
    total = compose([_gaussian(2.0, key="g1"), _gaussian(2.0, key="g2")])
    expected = gaussian_epsilon(2.0 / math.sqrt(2.0), DELTA)
    assert total.epsilon_at_delta == pytest.approx(expected, abs=PLD_TOLERANCE)


def test_gaussian_with_randomized_response_or_at_the_cut_layer_is_never_none():
    # Prepare
    gauss, rr = _gaussian(1.0), _pure("discrete", 1.0, "r")

    # Execute
    mixed = compose([gauss, rr])
    cut = compose([_gaussian(1.0, placement="cut")])
    laplace_rr = compose([_pure("laplace", 1.0, "l"), rr])

    # Assert: replace-one and add/remove events compose by basic composition
    # of each relation's (eps, delta / 2): finite, above either alone, below
    # the Gaussian's eps at delta / 2 plus the RR's pure 1.
    assert mixed.epsilon == math.inf
    assert gaussian_epsilon(1.0, DELTA) < mixed.epsilon_at_delta
    assert mixed.epsilon_at_delta <= gaussian_epsilon(1.0, DELTA / 2) + 1.0 + 1e-3
    # The cut layer has no bounded sensitivity: no guarantee, stated as inf.
    assert cut.epsilon == math.inf and cut.epsilon_at_delta == math.inf
    # Pure releases of both relations: the pure sum, never above it.
    assert laplace_rr.epsilon == 2.0 and laplace_rr.epsilon_at_delta <= 2.0


def test_ledger_show_states_a_gaussian_total_as_inf_and_eps_at_delta(tmp_path):
    # Prepare
    ledger = PrivacyLedger(tmp_path / "ledger")
    labels = ledger.label_set(np.arange(100), np.arange(100) % 2, public=False)
    ledger.record(labels, _gaussian(1.0))

    # Execute
    text = ledger_text(ledger)

    # Assert
    assert "total epsilon inf (no pure guarantee; 4.38 at delta 1e-05)" in text
    assert "epsilon inf (no pure guarantee)  run" in text
    assert "None" not in text


# ----------------------------------------------------- b, c. sweep outputs
GRID = """
[grid]
datasets = ["breast-cancer"]
mechanisms = ["laplace", "gaussian"]
epsilons = [1]
sigmas = [1.0]
seeds = [0]

[experiment]
epochs = 1
batch-size = 128
noise-seed = 0
checkpoint = false
"""


@pytest.fixture(scope="module")
def gaussian_sweep(tmp_path_factory):
    """A Laplace and a Gaussian release of one label set, as a sweep writes them.

    Counted as releases (``--release``): a sweep's own runs are rehearsals
    otherwise, recorded but out of the total.
    """
    folder = tmp_path_factory.mktemp("sweep")
    monkey = pytest.MonkeyPatch()
    monkey.setenv("TPSL_FLWR_LEDGER_DIR", str(folder / "ledger"))
    try:
        (folder / "grid.toml").write_text(GRID)
        run_sweep(
            load_sweep(folder / "grid.toml"),
            folder / "out",
            progress=False,
            release=True,
            new_release=True,
        )
    finally:
        monkey.undo()
    ledger = PrivacyLedger(folder / "ledger")
    ((label_set, entries),) = ledger.sets()
    assert [e.mechanism for e in entries] == ["laplace", "gaussian"]
    return folder / "out", ledger.total(label_set)


def test_runs_csv_fills_epsilon_total_now_for_every_row(gaussian_sweep):
    out, total = gaussian_sweep
    for name in ("runs.csv", "runs-public.csv"):
        with (out / name).open() as handle:
            rows = list(csv.DictReader(handle))
        # Every row, the Gaussian's included, has the set's total now: pure
        # inf beside the PLD's (eps, delta) over both releases.
        assert len(rows) == 2
        for row in rows:
            assert row["epsilon_total_now"] == "inf", (name, row["run"])
            at_delta = float(row["epsilon_total_now_at_delta"])
            assert at_delta == pytest.approx(total.epsilon_at_delta, abs=1e-9)
            assert (
                gaussian_epsilon(1.0, DELTA)
                < at_delta
                <= (gaussian_epsilon(1.0, DELTA) + 1.0 + PLD_TOLERANCE)
            )
        gaussian = next(r for r in rows if r["mechanism"] == "gaussian")
        assert gaussian["epsilon_total"] == "inf"  # was empty (None)


def test_tables_md_has_a_total_column(gaussian_sweep):
    out, total = gaussian_sweep
    tables = (out / "tables.md").read_text()
    stated = f"inf (no pure guarantee; {total.epsilon_at_delta:.3g} at delta 1e-05)"
    for title in ("Table 2: Laplace", "Gaussian baseline"):
        section = tables.split(f"## {title}")[1].split("\n## ")[0]
        assert "| SDA vs ceiling | key | total |" in section
        assert f"| seed (not secure) | {stated} |" in section
    assert "total = the label set's epsilon now" in tables


# ------------------------------------------------ d. report.md and summary
def _results(mechanism, **extra):
    return {
        "mechanism": mechanism,
        "epsilon": None,
        "sigma": None,
        "dataset": "breast-cancer",
        "engine": "local",
        "num_parties": 2,
        "placement": "logits",
        "epochs": 1,
        "epsilon_spent": "inf",
        "noise_key": {"secure": True},
        "test_auc": 0.9,
        "samples_per_second": 900.0,
        "seconds": 1.0,
        "config": {"out-dir": "/tmp/run"},
        "history": [],
        **extra,
    }


def test_report_md_says_an_unprotected_run_has_no_protection():
    text = markdown(_results("none", epsilon_total="inf"))
    title = text.splitlines()[0]
    assert title == "# TPSL run: none (no protection, epsilon = inf), breast-cancer"
    assert "None" not in text


def test_a_gaussian_runs_report_and_summary_state_its_total():
    # Prepare: results as run_label_party writes them for a Gaussian run.
    total = compose([_gaussian(1.0)]).to_dict()
    results = _results(
        "gaussian",
        sigma=1.0,
        epsilon_spent=None,
        epsilon_total=total["epsilon"],
        ledger={"total": total},
    )
    stated = "inf (no pure guarantee; 4.38 at delta 1e-05)"

    # Execute
    report, line = markdown(results), summary_line("simulate", results)

    # Assert
    assert f"total over every release of these labels: {stated}" in report
    assert f"(total {stated})" in line
    assert "None" not in report and "None" not in line
