import dataclasses
import json
import subprocess
import sys

import pytest

from tpsl_flwr.attacks.mechanism_audit import run_audit
from tpsl_flwr.cli.main import main
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.privacy.closed_forms import sda_auc_laplace
from tpsl_flwr.privacy.mechanisms import LaplacePerturb, make_mechanism

# 100k labels: the SDA AUC's standard error is ~0.0016, so 0.01 is > 6 SE.
SAMPLES = 100_000


@pytest.mark.parametrize(
    ("name", "kwargs", "expected"),
    [
        ("laplace", {"epsilon": 1.0}, 0.7241),
        ("discrete", {"epsilon": 1.0}, 0.7311),
        ("laplace", {"epsilon": 0.5}, sda_auc_laplace(0.5)),
        ("gaussian", {"sigma": 1.0}, 0.7602),
    ],
)
def test_binary_sda_auc_matches_closed_form(name, kwargs, expected):
    result = run_audit(make_mechanism(name, **kwargs), samples=SAMPLES, seed=1)
    assert result.sda_auc == pytest.approx(expected, abs=0.01)
    assert result.expected == pytest.approx(expected, abs=1e-4)
    assert not result.violation


@pytest.mark.parametrize(
    ("name", "expected"), [("discrete", 0.4509), ("laplace", 0.2573)]
)
def test_multiclass_sda_top1_matches_closed_form(name, expected):
    mech = make_mechanism(name, epsilon=2.0, num_classes=10)
    result = run_audit(mech, samples=SAMPLES, seed=2)
    assert result.sda_top1 == pytest.approx(expected, abs=0.01)
    assert result.top1_bound == pytest.approx(0.4509, abs=1e-4)
    assert not result.violation


def test_no_protection_is_fully_broken_and_not_a_violation():
    result = run_audit(make_mechanism("none"), samples=20_000)
    assert result.sda_auc == 1.0
    assert not result.violation


def test_a_mechanism_weaker_than_it_claims_is_caught():
    # A Laplace mechanism that claims epsilon = 0.5 but uses the scale of 3.
    @dataclasses.dataclass(frozen=True)
    class Mislabelled(LaplacePerturb):
        @property
        def scale(self) -> float:
            return 1.0 / 3.0

    result = run_audit(Mislabelled(eps=0.5), samples=SAMPLES, seed=3)
    assert result.violation
    assert "exceeds" in result.verdict
    assert result.empirical_epsilon_lower_bound > 0.5


def test_prior_changes_labels_not_the_auc():
    result = run_audit(
        make_mechanism("discrete", epsilon=1.0), samples=SAMPLES, prior=[0.1]
    )
    assert result.prior == pytest.approx([0.9, 0.1])
    assert result.sda_auc == pytest.approx(0.7311, abs=0.015)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"samples": 10}, "samples must be an integer >= 1000, got 10"),
        ({"prior": [1.5]}, "prior probabilities must lie in"),
        ({"prior": [0.5, 0.3]}, "sum to 1"),
        ({"prior": [0.2, 0.3, 0.5]}, "prior must give"),
    ],
)
def test_bad_audit_inputs(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        run_audit(make_mechanism("laplace", epsilon=1.0), **kwargs)


def test_cli_json_to_stdout(capsys):
    code = main(
        [
            "audit",
            "--mechanism",
            "discrete",
            "--epsilon",
            "1",
            "--samples",
            "20000",
            "--json",
            "-",
        ]
    )
    record = json.loads(capsys.readouterr().out)
    assert code == 0
    for field in (
        "mechanism",
        "epsilon",
        "classes",
        "samples",
        "sda_auc",
        "expected",
        "auc_bound",
        "empirical_epsilon_lower_bound",
    ):
        assert field in record
    assert record["sda_auc"] == pytest.approx(0.7311, abs=0.02)


def test_cli_table_and_json_file(tmp_path, capsys):
    path = tmp_path / "audit.json"
    code = main(
        [
            "audit",
            "--classes",
            "10",
            "--mechanism",
            "discrete",
            "--epsilon",
            "2",
            "--samples",
            "20000",
            "--json",
            str(path),
        ]
    )
    assert code == 0
    assert "sda_top1" in capsys.readouterr().out
    assert json.loads(path.read_text())["sda_top1"] == pytest.approx(0.4509, abs=0.02)


def _exit_code(argv):
    try:
        return main(argv)
    except SystemExit as stop:  # argparse rejects malformed values this way
        return stop.code


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--epsilon", "0"], "epsilon must be > 0 and finite, got 0.0"),
        (["--epsilon", "-2"], "epsilon must be > 0"),
        (["--epsilon", "nan"], "epsilon must be > 0 and finite, got nan"),
        (["--epsilon", "inf"], "got inf"),
        (["--epsilon", "one"], "epsilon must be a number, got 'one'"),
        (["--mechanism", "gaussian", "--sigma", "-1"], "sigma must be > 0"),
        (["--mechanism", "gaussian"], "needs sigma"),
        (["--classes", "1"], "classes must be >= 2, got 1"),
        (["--mechanism", "lapalce"], "invalid choice: 'lapalce'"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(argv, match, capsys):
    assert _exit_code(["audit", "--samples", "2000", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert match in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_installed_command_exits_nonzero_naming_epsilon():
    proc = subprocess.run(
        [sys.executable, "-m", "tpsl_flwr.cli", "audit", "--epsilon", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    assert "epsilon" in proc.stderr and "Traceback" not in proc.stderr
