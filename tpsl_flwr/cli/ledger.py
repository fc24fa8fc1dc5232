"""``tpsl-flwr ledger``: read the privacy ledger, acknowledge a further release.

* ``ledger show [--ledger-dir D]``: every label set the label party has
  released or rehearsed, each line marked ``release``, ``rehearsal`` (not
  counted) or ``void`` (failed before a gradient left), with its key,
  mechanism, epsilon, epochs, run and time, and the set's total over its
  counted releases, pure and at ``delta = 1e-5`` (a set with a Gaussian
  release has no pure total: ``inf (no pure guarantee; ...)``).
* ``ledger release LABEL_DIR``: a rehearsal whose outputs (the nodes'
  bottom models, say) were shared is a release: record it as one.
* ``ledger acknowledge LABEL_DIR [--budget X]``: the label party's decision
  that the next fresh run with that ``label-dir`` is a further release (for
  plain ``flwr run``, whose ServerApp finds it in the folder; the CLI's
  ``--new-release`` does the same).

The ledger holds no label and no key, only keyed fingerprints; it is still
the label party's own file (``0600`` in a ``0700`` folder, see
:mod:`tpsl_flwr.release.ledger`).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from tpsl_flwr.cli.flags import number

__all__ = ["add_parser", "cmd_ledger", "ledger_text"]


def add_parser(subparsers: Any) -> None:
    """Add ``ledger show`` and ``ledger acknowledge`` to ``subparsers``."""
    ledger = subparsers.add_parser(
        "ledger",
        help="the label party's privacy ledger: every release of each label set",
        description=__doc__.splitlines()[0],
    )
    actions = ledger.add_subparsers(dest="ledger_command", required=True)
    show = actions.add_parser("show", help="every label set, its releases and total")
    show.add_argument(
        "--ledger-dir",
        default=None,
        help="the ledger folder (default: $TPSL_FLWR_LEDGER_DIR, else "
        "~/.local/share/tpsl-flwr/ledger)",
    )
    show.add_argument("--json", action="store_true", help="print JSON instead")
    ack = actions.add_parser(
        "acknowledge",
        help="the next fresh run with LABEL_DIR is a further release",
    )
    ack.add_argument("label_dir", help="the label party's folder (label-dir)")
    ack.add_argument(
        "--budget",
        type=number("budget"),
        default=None,
        help="refuse the release if the label set's total epsilon would exceed this",
    )
    ack.add_argument(
        "--unprotected",
        action="store_true",
        help="allow the release to be unprotected (mechanism none)",
    )
    ack.add_argument(
        "--release",
        action="store_true",
        help="count the next run as a release whatever its engine",
    )
    shared = actions.add_parser(
        "release",
        help="count the rehearsal of LABEL_DIR as a release (its outputs were shared)",
    )
    shared.add_argument("label_dir", help="the rehearsal's label party folder")
    shared.add_argument(
        "--new-release",
        action="store_true",
        help="acknowledge a further release of labels released before",
    )
    shared.add_argument(
        "--unprotected-release",
        action="store_true",
        help="allow it to be an unprotected release (mechanism none)",
    )
    ledger.set_defaults(handler=cmd_ledger)


def cmd_ledger(args: argparse.Namespace) -> int:
    """``ledger``: print the ledger, or acknowledge a further release."""
    from tpsl_flwr.release.ledger import PrivacyLedger
    from tpsl_flwr.release.store import LabelStore

    if args.ledger_command == "release":
        view = LabelStore(args.label_dir).record_shared(
            new_release=args.new_release,
            unprotected_release=args.unprotected_release,
        )
        print(
            f"tpsl-flwr ledger: the run of {args.label_dir!r} is recorded as a "
            f"release; label set {view.label_set} total epsilon "
            f"{view.total.epsilon} over {view.total.releases} release(s)"
        )
        return 0
    if args.ledger_command == "acknowledge":
        path = LabelStore(args.label_dir).acknowledge_new_release(
            args.budget, unprotected=args.unprotected, release=args.release
        )
        budget = "" if args.budget is None else f", budget epsilon {args.budget:g}"
        print(
            f"tpsl-flwr ledger: the next fresh run with label-dir {args.label_dir!r} "
            f"is acknowledged as a further release{budget} ({path})"
        )
        return 0
    ledger = PrivacyLedger(args.ledger_dir)
    if args.json:
        print(json.dumps(ledger_records(ledger), indent=2))
    else:
        print(ledger_text(ledger))
    return 0


def ledger_records(ledger: Any) -> list[dict[str, Any]]:
    """The ledger as JSON-ready records, one per label set, with totals."""
    out = []
    for label_set, entries in ledger.sets():
        out.append(
            {
                "label_set": label_set.to_dict(),
                "releases": [e.to_dict() for e in entries],
                "total": ledger.total(label_set).to_dict(),
            }
        )
    return out


def ledger_text(ledger: Any) -> str:
    """The ledger as lines for people (empty ledgers say so).

    A total is the pure sum beside dp-accounting's ``(eps, delta)``: ``inf
    (no pure guarantee; 4.38 at delta 1e-05)`` for a set with a Gaussian
    release (:func:`~tpsl_flwr.privacy.epsilon_text.total_text`).
    """
    from tpsl_flwr.privacy.epsilon_text import epsilon_text, total_text

    records = ledger_records(ledger)
    if not records:
        return f"tpsl-flwr ledger: no release recorded in {ledger.folder}"
    lines = [f"tpsl-flwr ledger: {ledger.folder}"]
    for record in records:
        label_set, total = record["label_set"], record["total"]
        kind = " (public rehearsal data)" if label_set["public"] else ""
        summed = total_text(total["epsilon"], total["epsilon_at_delta"], total["delta"])
        lines.append(
            f"label set {label_set['fingerprint']}: {label_set['rows']} records{kind}; "
            f"total epsilon {summed} over {total['releases']} release(s)"
        )
        for entry in record["releases"]:
            value = entry["parameter_value"]
            setting = (
                entry["mechanism"]
                if value is None
                else f"{entry['mechanism']} {entry['parameter']} {value:g}"
            )
            lines.append(
                f"  {entry['time']}  {entry.get('kind', 'release'):9}  "
                f"key {entry['key_fingerprint']} "
                f"({entry['key_origin']})"
                f"  {setting}, {entry['placement']}, {entry['epochs']} epoch(s): "
                f"epsilon {epsilon_text(entry['epsilon'], entry['mechanism'])}  "
                f"run {entry['run'] or '-'}"
                + ("  [acknowledged]" if entry["acknowledged"] else "")
            )
    return "\n".join(lines)
