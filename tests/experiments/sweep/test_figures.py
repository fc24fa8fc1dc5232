"""The sweep's figures and tables read back: labels, ceilings, error bars, epochs.

Rows come from made-up results (:mod:`.results_factory`) with known values,
run through :func:`run_row` as a sweep does; the figures are inspected as
matplotlib artists and through their JSON sidecars.
"""

import csv
import io
import json
import math

import matplotlib.pyplot as plt
import pytest
from matplotlib.container import ErrorbarContainer

from tpsl_flwr.experiments.sweep.figures import FIGURES, build_figures
from tpsl_flwr.experiments.sweep.report import tables_markdown, write_report
from tpsl_flwr.experiments.sweep.run import csv_columns, run_row
from tpsl_flwr.privacy.closed_forms import auc_bound

from .results_factory import grid, results

SIGMA = "\u03c3"


@pytest.fixture
def marvell():
    """Marvell runs: no DP guarantee, its parameter the power constraint.

    As the registry has it: its parameter ``marvell_power``, its results
    ``epsilon = None``.
    """
    return {
        f"criteo_marvell_power{p:g}_seed{s}": results(
            "marvell",
            s,
            marvell_power=p,
            utility=0.72 + 0.02 * p + 0.01 * s,
            sda=0.6 + 0.05 * p,
        )
        for p in (1.0, 4.0)
        for s in (0, 1)
    }


def _rows(runs, epoch="best"):
    return [run_row(name, content, epoch) for name, content in runs.items()]


def _one_seed_discrete(runs):
    """Drop the seed-1 discrete run: its point then shows the run's own SE."""
    return {n: r for n, r in runs.items() if n != "criteo_discrete_eps1_seed1"}


@pytest.fixture
def figures(marvell):
    runs = _one_seed_discrete({**grid(), **marvell})
    built = build_figures(_rows(runs))
    yield built
    for fig, _ in built.values():
        plt.close(fig)


def _texts(fig):
    return {t.get_text() for ax in fig.axes for t in ax.texts}


def _series(data, kind=None):
    return [
        s
        for panel in data["panels"]
        for s in panel["series"]
        if kind is None or s["kind"] == kind
    ]


def _error_bars(fig):
    """Per error-bar container: the lengths of its y error segments."""
    found = []
    for ax in fig.axes:
        for container in ax.containers:
            if isinstance(container, ErrorbarContainer):
                _, _, (*bars,) = container.lines
                segments = bars[-1].get_segments()  # the y bars come last
                found.append([abs(s[1][1] - s[0][1]) for s in segments])
    return found


def test_utility_vs_epsilon_labels_every_point_and_places_gaussian_at_its_eps(
    figures,
):
    # Execute
    fig, data = figures["fig5_utility_vs_epsilon"]

    # Assert: labels, the Gaussian at its (eps, delta), marvell left out.
    texts = _texts(fig)
    assert {"ε=1", "ε=4", f"{SIGMA}=2"} <= texts
    assert not any(t.startswith("power") for t in texts)
    names = {s["name"] for s in _series(data, "points")}
    assert names == {"laplace", "discrete", "gaussian (ε at δ=1e-05)"}
    gaussian = next(s for s in _series(data) if s["name"].startswith("gaussian"))
    assert [p["x"] for p in gaussian["points"]] == [2.0]  # 4 / sigma in the factory
    assert "Not shown: marvell (no DP guarantee" in data["caption"]
    assert [s["y"] for s in _series(data, "baseline")] == [pytest.approx(0.805)]
    # No twin axes: one axes per panel.
    assert len(fig.axes) == len(data["panels"]) == 1
    assert "(best epoch)" in fig.get_suptitle()


def test_utility_vs_sda_has_every_mechanism_labels_and_the_ceiling(figures):
    # Execute
    fig, data = figures["fig5_utility_vs_sda"]

    # Assert: every mechanism, no DP guarantee included, each point labelled.
    names = {s["name"] for s in _series(data, "points")}
    assert names == {
        "laplace",
        "discrete",
        "gaussian",
        "marvell (no DP guarantee)",
        "no protection",
    }
    texts = _texts(fig)
    assert {"ε=1", "ε=4", f"{SIGMA}=2", "P=1", "P=4", "no protection"} <= (texts)
    for series in _series(data, "points"):
        assert all(p["label"] for p in series["points"])
    # The eps ceiling: one curve per eps-DP mechanism, at e^eps / (1 + e^eps).
    ceilings = {s["name"]: s for s in _series(data, "ceiling")}
    assert set(ceilings) == {"laplace: ε ceiling", "discrete: ε ceiling"}
    assert ceilings["laplace: ε ceiling"]["x"] == pytest.approx(
        [auc_bound(1.0), auc_bound(4.0)]
    )
    drawn = [line for ax in fig.axes for line in ax.lines if line.get_gid()]
    assert {line.get_gid() for line in drawn} == {"ceiling"}
    assert "ceiling" in data["caption"] and "no DP guarantee" in data["caption"]


def test_error_bars_are_the_seed_spread_or_the_runs_own_se(figures):
    # Execute
    fig, data = figures["fig5_utility_vs_sda"]

    # Assert: two seeds -> std over seeds; the lone discrete run -> its own SE.
    spreads = {
        s["name"]: {p["spread"] for p in s["points"]} for s in _series(data, "points")
    }
    assert spreads["laplace"] == {"std over seeds"}
    assert spreads["discrete"] == {"run's own SE"}
    laplace = next(s for s in _series(data) if s["name"] == "laplace")
    eps1 = next(p for p in laplace["points"] if p["label"] == "ε=1")
    assert eps1["yerr"] == pytest.approx(0.005)  # seeds 0.70 and 0.71
    discrete = next(s for s in _series(data) if s["name"] == "discrete")
    assert discrete["points"][0]["xerr"] == pytest.approx(0.015)  # the SDA's SE
    assert discrete["points"][0]["yerr"] > 0  # Hanley-McNeil of the test AUC
    assert "std over seeds where a point has several runs" in data["caption"]
    assert "the run's own standard error" in data["caption"]
    bars = _error_bars(fig)
    assert len(bars) == len(_series(data, "points"))
    assert all(length > 0 for lengths in bars for length in lengths)


def test_attacks_vs_epsilon_has_na_sa_sda_with_errors_and_the_ceiling(figures):
    # Execute
    fig, data = figures["attacks_vs_epsilon"]

    # Assert: one panel per mechanism, each with NA, SA, SDA and their SEs.
    titles = [p["title"] for p in data["panels"]]
    assert titles == [
        "criteo: laplace",
        "criteo: discrete",
        "criteo: gaussian ((eps, delta)-DP)",
        "criteo: marvell (no DP guarantee)",
    ]
    for panel in data["panels"]:
        points = {s["name"]: s for s in panel["series"] if s["kind"] == "points"}
        assert set(points) == {"NA", "SA", "SDA"}
        for series in points.values():
            assert all(p["yerr"] > 0 for p in series["points"])
        assert all(p["label"] for p in points["SDA"]["points"])
    laplace, _, gaussian, marvell_panel = data["panels"]
    ceiling = [s for s in laplace["series"] if s["kind"] == "ceiling"]
    assert len(ceiling) == 1
    assert ceiling[0]["y"][0] == pytest.approx(auc_bound(1.0))
    assert ceiling[0]["y"][-1] == pytest.approx(auc_bound(4.0))
    assert not [s for s in gaussian["series"] if s["kind"] == "ceiling"]
    assert marvell_panel["x_label"] == "marvell_power"
    assert len(fig.axes) == len(data["panels"])  # no twin axes


def test_epoch_best_and_last_show_each_epochs_values():
    # Prepare: epoch 1 is the best; epoch 2 is 0.05 lower in test AUC.
    runs = grid()

    # Execute
    best = build_figures(_rows(runs, "best"))
    last = build_figures(_rows(runs, "last"))

    # Assert
    def laplace_eps1(built):
        fig, data = built["fig5_utility_vs_epsilon"]
        plt.close(fig)
        series = next(s for s in _series(data) if s["name"] == "laplace")
        return next(p["y"] for p in series["points"] if p["label"] == "ε=1")

    assert laplace_eps1(best) == pytest.approx(0.705)
    assert laplace_eps1(last) == pytest.approx(0.655)
    for name in FIGURES:
        plt.close(best[name][0])
        plt.close(last[name][0])
    assert "(best epoch)" in best[FIGURES[0]][0].get_suptitle()
    assert "(last epoch)" in last[FIGURES[0]][0].get_suptitle()
    assert best[FIGURES[0]][1]["epoch"] == "best epoch (chosen on the validation split)"


def test_tables_say_no_dp_guarantee_and_show_directions(marvell, tmp_path):
    # Prepare: the spectral AUC reported inverted by the run's attack report.
    runs = {**grid(direction={"spectral": "inverted"}), **marvell}
    rows = _rows(runs)

    # Execute
    tables = tables_markdown(rows)
    files = write_report(rows, tmp_path)

    # Assert: marvell's table, its epsilon cell empty; the Gaussian's (eps, delta).
    section = tables.split("## marvell (no DP guarantee)")[1].split("##")[0]
    assert "| dataset | marvell_power | epsilon | utility |" in section
    assert "| criteo | 1 |  | 0.745 ± 0.005 |" in section
    gaussian = tables.split("## Gaussian baseline")[1].split("##")[0]
    assert "| criteo | 2 | 2 (delta 1e-05) |" in gaussian
    assert "[inverted]" in tables.split("## Table 2")[1].split("##")[0]
    assert "spectral_direction" in csv_columns(rows)
    # LaTeX and CSV beside the Markdown.
    names = [f.name for f in files]
    assert names[:3] == ["tables.md", "tables.tex", "summary.csv"]
    tex = (tmp_path / "tables.tex").read_text()
    assert r"\caption{marvell (no DP guarantee)}" in tex
    assert tex.count(r"\begin{tabular}") == tables.count("\n|---")
    summary = list(csv.DictReader(io.StringIO((tmp_path / "summary.csv").read_text())))
    marvell_rows = [r for r in summary if r["mechanism"] == "marvell"]
    assert [(r["level"], r["guarantee"], r["epsilon"]) for r in marvell_rows] == [
        ("1", "no DP guarantee", ""),
        ("4", "no DP guarantee", ""),
    ]
    laplace = next(r for r in summary if r["mechanism"] == "laplace")
    assert (laplace["runs"], laplace["utility_err_is"]) == ("2", "std over seeds")
    assert float(laplace["ceiling"]) == pytest.approx(auc_bound(1.0))


def test_write_report_writes_png_pdf_and_the_data_drawn(tmp_path):
    # Execute
    files = write_report(_rows(grid()), tmp_path)

    # Assert
    for name in FIGURES:
        assert (tmp_path / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
        assert (tmp_path / f"{name}.pdf").read_bytes()[:4] == b"%PDF"
        data = json.loads((tmp_path / f"{name}.json").read_text())
        assert data["caption"] and data["panels"]
        for path in (tmp_path / f"{name}.{s}" for s in ("png", "pdf", "json")):
            assert path in files
            assert oct(path.stat().st_mode & 0o777) == oct(0o600)
    sda = json.loads((tmp_path / "fig5_utility_vs_sda.json").read_text())
    points = [p for s in _series(sda, "points") for p in s["points"]]
    assert all(math.isfinite(p["x"]) and math.isfinite(p["y"]) for p in points)
