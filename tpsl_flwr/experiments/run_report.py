"""Per-run report: a Markdown summary and a PNG plot of utility and attacks.

Written by the label party next to ``results.json``: test AUC (or accuracy)
and each attack's AUC per epoch with its standard error, the epsilon-DP
ceiling on any attack (drawn as a line in the plot) and, per epoch, the
verdict of :func:`~tpsl_flwr.attacks.ceiling.ceiling_verdict` for every AUC
above it (Yang et al., Tables 1-3 and Figure 5, for one run).

Both are the label party's alone (mode ``0600``): test metrics and attack AUCs
are computed on the clean labels, which epsilon does not cover. What may be
shared is ``summary-public.json`` (:mod:`~tpsl_flwr.experiments.audience`).
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import IO, Any

from tpsl_flwr._util.private_files import write_private
from tpsl_flwr.attacks.ceiling import BELOW, SIGMAS_OF_TOLERANCE
from tpsl_flwr.attacks.report import INVERTED
from tpsl_flwr.privacy.epsilon_text import (
    NO_DP_GUARANTEE,
    epsilon_text,
    has_dp_guarantee,
    results_total_text,
)

REPORT_MD = "report.md"
REPORT_PNG = "report.png"
ATTACKS = ("norm", "cosine", "spectral", "sda", "sda_top1")


def format_cell(value: Any) -> str:
    """A table cell: ``-`` for missing, 4 decimals for floats (``nan``, ``inf`` too)."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def with_error(value: Any, se: Any) -> str:
    """A table cell with its standard error: ``0.7332 ± 0.0231``.

    Examples
    --------
    >>> with_error(0.7332, 0.02312), with_error(0.7, None), with_error(None, 0.1)
    ('0.7332 ± 0.0231', '0.7000', '-')
    """
    if value is None or not isinstance(se, int | float) or not math.isfinite(se):
        return format_cell(value)
    return f"{format_cell(value)} ± {se:.4f}"


def verdict_cell(attacks: dict[str, Any]) -> str:
    """The ceiling verdicts of an epoch: ``below`` or each AUC above it.

    Examples
    --------
    >>> verdict_cell({"ceiling_verdict": {"norm": "below the ceiling",
    ...                                   "sda": "within sampling error"}})
    'sda: within sampling error'
    >>> verdict_cell({"ceiling_verdict": {"sda": "below the ceiling"}})
    'all below'
    >>> verdict_cell({})
    '-'
    """
    verdicts = {k: v for k, v in (attacks.get("ceiling_verdict") or {}).items() if v}
    if not verdicts:
        return "-"
    above = [f"{k}: {v}" for k, v in verdicts.items() if v != BELOW]
    return "; ".join(above) if above else "all below"


def setting_text(results: dict[str, Any]) -> str:
    """The mechanism's setting for a title: its parameter, or no protection.

    Examples
    --------
    >>> setting_text({"mechanism": "none", "epsilon": None, "sigma": None})
    'no protection, epsilon = inf'
    >>> setting_text({"mechanism": "laplace", "epsilon": 1.0, "sigma": None})
    'epsilon = 1.0'
    >>> setting_text({"mechanism": "gaussian", "epsilon": None, "sigma": 2.0})
    'sigma = 2.0, no pure epsilon'
    >>> setting_text({"mechanism": "marvell", "marvell_power": 2.0})
    'marvell-power = 2.0, no DP guarantee'
    >>> setting_text({"mechanism": "max-norm"})
    'no DP guarantee'
    """
    if not has_dp_guarantee(results.get("mechanism")):
        power = results.get("marvell_power")
        prefix = "" if power is None else f"marvell-power = {power}, "
        return f"{prefix}{NO_DP_GUARANTEE}"
    if results.get("sigma") is not None:
        return f"sigma = {results['sigma']}, no pure epsilon"
    if results.get("epsilon") is not None:
        return f"epsilon = {results['epsilon']}"
    return "no protection, epsilon = inf"


def ceiling_cell(attacks: dict[str, Any]) -> str:
    """The epoch's ceiling: the plain eps one, and the prior-aware one if used.

    Examples
    --------
    >>> ceiling_cell({"auc_bound": 0.7311})
    '0.7311'
    >>> ceiling_cell({"auc_bound": 0.828, "auc_bound_without_prior": 0.7311})
    '0.7311; 0.8280 with the label prior'
    """
    bound, plain = attacks.get("auc_bound"), attacks.get("auc_bound_without_prior")
    if bound is None or plain is None or plain >= bound:
        return format_cell(bound)
    return f"{format_cell(plain)}; {format_cell(bound)} with the label prior"


def _utility_key(history: list[dict[str, Any]]) -> str:
    return "test_auc" if history and "test_auc" in history[0] else "test_accuracy"


def markdown(results: dict[str, Any]) -> str:
    """The run's summary as Markdown (settings, privacy, per-epoch table)."""
    history = results.get("history", [])
    utility = _utility_key(history)
    lines = [
        f"# TPSL run: {results['mechanism']} ({setting_text(results)}), "
        f"{results['dataset']}",
        "",
        f"- engine: {results['engine']}; parties: {results['num_parties']}; "
        f"placement: {results['placement']}; epochs: {results['epochs']}",
        "- epsilon spent per label: "
        f"{epsilon_text(results['epsilon_spent'], results['mechanism'])}; "
        "total over every release of these labels: "
        f"{results_total_text(results)}; "
        "noise key: "
        f"{'secure' if results['noise_key']['secure'] else 'seeded (NOT secure)'}",
        f"- final {utility}: {format_cell(results.get(utility))}; "
        f"samples/s: {results['samples_per_second']:.0f}",
    ]
    lines += [f"- note: {note}" for note in results.get("privacy", {}).get("notes", [])]
    attacks = [
        a
        for a in ATTACKS
        if any(
            a in (h.get("attack_auc") or {}) and h["attack_auc"][a] is not None
            for h in history
        )
    ]
    header = ["epoch", utility]
    if attacks:
        header += [*attacks, "ceiling", "verdict"]
    lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for h in history:
        row = [str(h["epoch"]), format_cell(h.get(utility))]
        if attacks:
            found = h.get("attack_auc") or {}
            errors = found.get("standard_error") or {}
            turned = found.get("direction") or {}
            row += [
                with_error(found.get(a), errors.get(a))
                + (f" ({INVERTED})" if turned.get(a) == INVERTED else "")
                for a in attacks
            ]
            row.append(ceiling_cell(found))
            row.append(verdict_cell(found))
        lines.append("| " + " | ".join(row) + " |")
    if attacks:
        lines += [
            "",
            "Attack AUCs are pooled over each epoch's training samples, on what "
            "party 0 received (white-box SDA uses the top model of each step), "
            "± their Hanley-McNeil standard error over those samples (binomial "
            "for SDA top-1). The ceiling e^eps/(1+e^eps) bounds any attack on an "
            "eps-DP label; an AUC above it is 'within sampling error' unless it "
            f"exceeds it by more than {SIGMAS_OF_TOLERANCE:g} standard errors "
            "('above the ceiling': a violation of the guarantee); at AUC 1 or 0, "
            "where that error is 0, an exact binomial test decides. The verdict "
            "reads max(AUC, 1 - AUC). Where the top model trains on the "
            "posterior, the verdict uses the prior-aware ceiling, printed after "
            "the plain one. An attack whose AUC was below 0.5 scored the wrong way "
            "round: it is shown as 1 - AUC, marked (inverted).",
        ]
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: str | Path | IO[bytes]) -> None:
    """Plot utility and attack AUCs per epoch, with the ceiling, to ``path``.

    ``path`` is a file name or a binary file object; the image is a PNG.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    history = results.get("history", [])
    utility = _utility_key(history)
    epochs = [h["epoch"] for h in history]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    ax.plot(
        epochs,
        [h.get(utility, math.nan) for h in history],
        "k-o",
        label=utility.replace("_", " "),
    )
    for name in ATTACKS:
        values = [(h.get("attack_auc") or {}).get(name) for h in history]
        errors = [
            ((h.get("attack_auc") or {}).get("standard_error") or {}).get(name)
            for h in history
        ]
        if any(v is not None for v in values):
            ax.errorbar(
                epochs,
                [math.nan if v is None else v for v in values],
                yerr=[
                    e if isinstance(e, float) and math.isfinite(e) else 0.0
                    for e in errors
                ],
                fmt="--.",
                capsize=2,
                label=f"{name} attack (± SE)",
            )
    epochs_attacked = [h.get("attack_auc") or {} for h in history]
    first = next((a for a in epochs_attacked if a.get("auc_bound") is not None), {})
    bound, plain = first.get("auc_bound"), first.get("auc_bound_without_prior")
    if plain is not None and plain < 1.0:
        ax.axhline(plain, color="red", linewidth=1, label=f"eps-DP ceiling {plain:.3f}")
        if bound is not None and bound > plain:
            ax.axhline(
                bound,
                color="red",
                linewidth=1,
                linestyle="--",
                label=f"ceiling with the label prior {bound:.3f}",
            )
    elif bound is not None and bound < 1.0:
        ax.axhline(bound, color="red", linewidth=1, label=f"eps-DP ceiling {bound:.3f}")
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("AUC / accuracy")
    ax.set_ylim(0.0, 1.02)
    ax.set_title(
        f"{results['dataset']}: {results['mechanism']}, "
        f"epsilon spent {epsilon_text(results['epsilon_spent'], results['mechanism'])} "
        + (
            f"(total {results_total_text(results)})"
            if results.get("run_kind") is None
            else f"({results['run_kind']}; total of releases "
            f"{results_total_text(results)})"
        )
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


def png_bytes(results: dict[str, Any]) -> bytes:
    """:func:`plot` of ``results`` as PNG bytes (to be written privately)."""
    buffer = io.BytesIO()
    plot(results, buffer)
    return buffer.getvalue()


def write_report(results: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """Write ``report.md`` and ``report.png`` into ``out_dir``, mode ``0600``.

    Raises
    ------
    PrivacyError
        If ``out_dir`` is not private (mode ``0700``, this user's).
    """
    md_path = write_private(out_dir / REPORT_MD, markdown(results).encode())
    return md_path, write_private(out_dir / REPORT_PNG, png_bytes(results))
