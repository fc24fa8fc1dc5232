"""What every ``tpsl-flwr`` command shares: exit statuses, JSON, the summary line.

A handler takes the parsed arguments and returns the exit status; a bad value
raises :class:`~tpsl_flwr.errors.TPSLError` and :mod:`~tpsl_flwr.cli.main`
turns it into one line and exit status 2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["EXIT_USAGE", "EXIT_VIOLATION", "summary_line", "write_json"]

EXIT_VIOLATION = 1
"""A run that did not complete, or an audit that found a violation."""
EXIT_USAGE = 2
"""A bad value: one line naming it, never a traceback."""


def summary_line(command: str, results: dict[str, Any]) -> str:
    """The last line of a run: utility, privacy, speed, each duration named, path.

    Examples
    --------
    >>> print(summary_line("flower-run", {
    ...     "test_auc": 0.61234, "epsilon_spent": 1.0, "samples_per_second": 2410.2,
    ...     "seconds": 41.71, "flower_wall_seconds": 55.62,
    ...     "config": {"out-dir": "/tmp/run"}}))  # doctest: +NORMALIZE_WHITESPACE
    tpsl-flwr flower-run: test_auc 0.6123, epsilon spent 1 (total 1),
    2410 samples/s, training 41.7 s (label party), wall 55.6 s (flwr run, incl. Ray
    start-up); results in /tmp/run/results.json

    A run says whether it was a release or a rehearsal (not counted):

    >>> print(summary_line("simulate", {
    ...     "test_auc": 0.7, "epsilon_spent": 1.0, "epsilon_total": 0.0,
    ...     "run_kind": "rehearsal", "samples_per_second": 10, "seconds": 1,
    ...     "config": {"out-dir": "/tmp/run"}}))  # doctest: +NORMALIZE_WHITESPACE
    tpsl-flwr simulate: test_auc 0.7000, epsilon spent 1 (rehearsal: not counted;
    total of releases 0), 10 samples/s, training 1.0 s (label party); results in
    /tmp/run/results.json
    """
    from tpsl_flwr.experiments.experiment import RESULTS_FILE
    from tpsl_flwr.privacy.epsilon_text import epsilon_text, results_total_text

    metric = "test_auc" if "test_auc" in results else "test_accuracy"
    kind = results.get("run_kind")
    spent = epsilon_text(results["epsilon_spent"], results.get("mechanism"))
    parts = [
        f"{metric} {results.get(metric, float('nan')):.4f}",
        f"epsilon spent {spent} "
        + (
            f"(total {results_total_text(results)})"
            if kind is None
            else f"({kind}{': not counted' if kind == 'rehearsal' else ''}; "
            f"total of releases {results_total_text(results)})"
        ),
        f"{results['samples_per_second']:.0f} samples/s",
        f"training {results['seconds']:.1f} s (label party)",
    ]
    if "round_trip_seconds" in results:
        parts.append(f"{results['round_trip_seconds']:.2f} s per round trip")
    if "flower_wall_seconds" in results:
        what = (
            "flwr run on the deployment"
            if results.get("engine") == "deployment"
            else "flwr run, incl. Ray start-up"
        )
        parts.append(f"wall {results['flower_wall_seconds']:.1f} s ({what})")
    path = Path(results["config"]["out-dir"]).resolve() / RESULTS_FILE
    return f"tpsl-flwr {command}: {', '.join(parts)}; results in {path}"


def write_json(results: dict[str, Any], path: str | None) -> None:
    """Write ``results`` as JSON to ``path`` (``-``: stdout; ``None``: nowhere).

    The file is mode ``0600``: a run's results and attack reports hold
    statistics computed on the clean labels (the label party's alone).
    """
    from tpsl_flwr._util.private_files import FILE_MODE
    from tpsl_flwr.experiments.run_folder import write_atomic

    text = json.dumps(results, indent=2, default=str)
    if path == "-":
        print(text)
    elif path:
        write_atomic(path, text, mode=FILE_MODE)
