"""One folder per run: what a run may find in its ``out-dir`` and what it leaves.

Every entry point (``tpsl-flwr simulate`` on either engine, ``tpsl-flwr
flower-run``, :func:`~tpsl_flwr.experiments.run.run_experiment`) follows these
rules, so a folder's ``results.json`` is always the last run's, and only if it
finished:

* a fresh run needs an empty (or missing) ``out-dir``; a label party's folder
  holding only an unbound key (``tpsl-flwr keygen``, ``--noise-seed``) counts
  as empty, since it is meant for the next run;
* ``overwrite`` removes what an earlier run wrote there (:data:`RUN_ENTRIES`,
  the label party's folder under ``out-dir`` with its key, a transcript under
  ``out-dir``); files no run writes are left alone;
* ``resume`` keeps the folder (the label party's key and checkpoint, the
  nodes' checkpoints) and moves an earlier ``results.json`` and report to
  ``*.previous.*``, so a failed resume never shows them as its own;
* ``results.json`` and ``report.md`` are written atomically
  (:func:`~tpsl_flwr._util.private_files.write_atomic`); a failed run leaves
  :data:`FAILED_FILE` holding its one-line error (:func:`failed_on_error`);
* the folder is the label party's: made ``0700``
  (:func:`~tpsl_flwr.experiments.audience.private_folder`), its results and
  ``FAILED`` written ``0600``; only ``summary-public.json`` is ``0644``
  (:mod:`~tpsl_flwr.experiments.audience`).

Sweeps give each run its own ``runs/<name>/`` and keep their own resume rules.

An embedder's ServerApp gets the same rules in one line with
:func:`run_in_folder` (also importable as ``tpsl_flwr.simulations.run_in_folder``),
which the project's own ServerApp uses too::

    run_in_folder(out_dir, lambda: train(grid, context))
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from logging import ERROR, INFO
from pathlib import Path
from typing import Any

from flwr.common.logger import log

from tpsl_flwr._util.private_files import FILE_MODE, write_atomic
from tpsl_flwr.errors import ConfigError, ReleaseRefused, ResumeRefused
from tpsl_flwr.experiments.audience import PUBLIC_SUMMARY, private_folder

__all__ = [
    "FAILED_FILE",
    "RUN_ENTRIES",
    "failed_on_error",
    "mark_failed",
    "one_line_error",
    "prepare_run_folder",
    "read_failure",
    "retire_results",
    "run_in_folder",
    "write_atomic",
]

RESULTS_FILE = "results.json"
"""The finished run's results (its presence says the run finished)."""
RESULTS = (RESULTS_FILE, "report.md", "report.png", PUBLIC_SUMMARY)
"""What a finished run leaves; :func:`retire_results` moves or removes them."""
FAILED_FILE = "FAILED"
"""The marker a failed run leaves in its out-dir: the error, one line."""
RUN_ENTRIES = (
    *RESULTS,
    FAILED_FILE,
    "flwr-run.log",
    "run-config.toml",
    "superlink.log",
    "checkpoints",
    *(f"{Path(name).stem}.previous{Path(name).suffix}" for name in RESULTS),
)
"""Everything a run writes directly in its out-dir (the label party's folder aside)."""
_KEY_FILE = "noise-key.json"
_DECISION_FILES = (_KEY_FILE, "new-release.json", "rehearsal.json")
"""What the label party's folder holds before a run (label_store.DECISION_FILES)."""
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt)): (.+)$")
_FLOWER_REASON = re.compile(r"<class '([\w.()]+)'>:<'(.*?)(?:'>)?$")


def prepare_run_folder(
    out_dir: str | Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    label_dir: str | Path | None = None,
    extra: Iterable[str | Path] = (),
    hint: str = "pass --overwrite to replace it or --resume to continue it",
) -> Path:
    """Make ``out_dir`` ready for one run; return it (absolute, created ``0700``).

    Parameters
    ----------
    out_dir
        The run's folder.
    resume
        Continue the run in ``out_dir``: keep it, retire its results.
    overwrite
        Replace the run in ``out_dir``: remove what it wrote.
    label_dir
        The label party's folder (default ``out_dir/label-party``); removed by
        ``overwrite`` only when it lies inside ``out_dir``.
    extra
        Further folders of the run (``transcript-dir``), removed by
        ``overwrite`` when inside ``out_dir``.
    hint
        How the user asks for ``overwrite`` or ``resume`` (the refusal's end).

    Raises
    ------
    ConfigError
        If ``out_dir`` holds an earlier run and neither ``resume`` nor
        ``overwrite`` is set (the message names the folder and what is in it),
        or if both are set.
    PrivacyError
        If another user owns ``out_dir`` (its results hold clean-label
        statistics, :func:`~tpsl_flwr.experiments.audience.private_folder`).
    """
    out = Path(out_dir).resolve()
    if resume and overwrite:
        raise ConfigError(
            "overwrite and resume exclude each other: resume continues the run "
            f"in {out}, overwrite replaces it"
        )
    label = out / "label-party" if label_dir is None else Path(label_dir).resolve()
    if resume:
        private_folder(out)
        retire_results(out, keep_previous=True)
        return out
    found = _earlier_run(out, label)
    if found and not overwrite:
        shown = ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")
        raise ConfigError(
            f"out-dir {out} already holds a run ({shown}); {hint}, or choose "
            "another out-dir"
        )
    if found:
        names = {*RUN_ENTRIES, *(_inside(out, p) for p in (label, *map(Path, extra)))}
        for name in sorted(n for n in names if n):
            _remove(out / name)
    return private_folder(out)


def _earlier_run(out: Path, label: Path) -> list[str]:
    """What in ``out`` an earlier run left (sorted names; ``[]``: fresh)."""
    if not out.is_dir():
        return []
    found = []
    for entry in sorted(out.iterdir()):
        if entry.resolve() == label and (
            _only_unbound_key(entry) or (entry.is_dir() and not any(entry.iterdir()))
        ):
            continue
        found.append(entry.name + ("/" if entry.is_dir() else ""))
    return found


def _only_unbound_key(folder: Path) -> bool:
    """Whether ``folder`` holds only what the label party left for its next run.

    An unbound key (keygen, a seed), its decisions for the run (a further
    release acknowledged, a budget) or a launcher's rehearsal mark.
    """
    try:
        names = [p.name for p in folder.iterdir()]
        if not names or not set(names) <= set(_DECISION_FILES):
            return False
        if _KEY_FILE not in names:
            return True
        return json.loads((folder / _KEY_FILE).read_text()).get("binding") is None
    except (OSError, ValueError, AttributeError):
        return False


def _inside(out: Path, path: Path) -> str:
    """``path``'s first component under ``out`` (``""`` if it is not inside)."""
    if not str(path):
        return ""
    try:
        relative = Path(path).resolve().relative_to(out)
    except ValueError:
        return ""
    return relative.parts[0] if relative.parts else ""


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        if _only_unbound_key(path):
            return  # a key provided for this run
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def retire_results(out_dir: str | Path, *, keep_previous: bool) -> None:
    """Take an earlier run's results and ``FAILED`` marker out of the way.

    ``keep_previous`` renames ``results.json`` to ``results.previous.json``
    (and the report likewise); otherwise they are removed.
    """
    out = Path(out_dir)
    (out / FAILED_FILE).unlink(missing_ok=True)
    for name in RESULTS:
        path = out / name
        if not path.exists():
            continue
        if keep_previous:
            os.replace(path, path.with_name(f"{path.stem}.previous{path.suffix}"))
        else:
            path.unlink()


def one_line_error(error: BaseException | str) -> str:
    r"""An error as one line: the cause, without its traceback.

    A node's error reply (Flower's ``<class 'X'>:<'message'>``, with Ray's
    traceback inside) becomes ``X: message``, or the traceback's first
    exception line (the root cause); other text keeps its first line.

    Examples
    --------
    >>> one_line_error("node 7 (partition 1) replied with an error: "
    ...                "<class 'ValueError'>:<'bad value'>")
    'node 7 (partition 1) replied with an error: ValueError: bad value'
    >>> one_line_error("node 7 replied with an error: <class 'ray.X(E)'>:<'ray::A\n"
    ...                "Traceback (most recent call last):\n  File x\n"
    ...                "OSError: disk full\n\nflwr.E: wrapped'>")
    'node 7 replied with an error: OSError: disk full'
    >>> one_line_error(KeyError("epochs"))
    "KeyError: 'epochs'"
    """
    if isinstance(error, BaseException):
        text = str(error)
        if not type(error).__module__.startswith("tpsl_flwr"):  # ours name it
            text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    else:
        text = error
    lines = [line.rstrip() for line in _ANSI.sub("", text).splitlines()]
    lines = [line for line in lines if line.strip()]
    if not lines:
        return "unknown error"
    head = lines[0]
    root = next((m.group(0) for m in map(_EXCEPTION_LINE.match, lines[1:]) if m), None)
    reason = _FLOWER_REASON.search(head)
    if reason is not None:
        name = reason.group(1).rsplit(".", 1)[-1]
        cause = root or (f"{name}: {reason.group(2)}" if reason.group(2) else name)
        return head[: reason.start()] + cause
    if root is not None and head.startswith(("Traceback", "ray::")):
        return root
    return head


def mark_failed(out_dir: str | Path, error: BaseException | str) -> Path:
    """Write :data:`FAILED_FILE` with the error's one line; return its path.

    Mode ``0600``: an error may quote the data (a bad label value, a count).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    line = one_line_error(error) + "\n"
    return write_atomic(out / FAILED_FILE, line, mode=FILE_MODE)


def read_failure(out_dir: str | Path) -> str | None:
    """The one-line error of the :data:`FAILED_FILE` in ``out_dir``, if any."""
    try:
        text = (Path(out_dir) / FAILED_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return text or None


@contextmanager
def failed_on_error(out_dir: str | Path) -> Iterator[None]:
    """Leave :data:`FAILED_FILE` in ``out_dir`` if the block raises (and re-raise).

    ``results.json`` of the failed run is never left: the block only writes it
    at its very end. A run the privacy ledger refused
    (:class:`~tpsl_flwr.errors.ReleaseRefused`) leaves no marker: it never
    started.
    """
    try:
        yield
    except KeyboardInterrupt:
        mark_failed(out_dir, "interrupted")
        raise
    except ReleaseRefused:
        raise  # refused before it started: the folder stays as it was
    except BaseException as err:
        if read_failure(out_dir) is None:
            mark_failed(out_dir, err)
        raise


def run_in_folder(
    out_dir: str | Path,
    run: Callable[[], Mapping[str, Any] | None],
    *,
    results_file: str | None = RESULTS_FILE,
) -> Mapping[str, Any] | None:
    """Run ``run()`` under the run-folder rules; the ServerApp's one line.

    1. ``out_dir`` is made the label party's (``0700``).
    2. ``run()`` is called. If it raises, an earlier run's results and report
       become ``*.previous.*`` and ``out_dir/FAILED`` gets the error's one
       line (:func:`one_line_error`: for a node's error its root cause,
       without Ray's wrapper text), that line is logged, and the error is
       re-raised (so ``flwr run`` records the run as failed). A run the
       privacy ledger refused (:class:`~tpsl_flwr.errors.ReleaseRefused`)
       leaves the folder as it was (one it created is removed).
    3. Otherwise the earlier results become ``*.previous.*`` and what ``run()``
       returns is written to ``out_dir/results_file`` atomically, mode
       ``0600`` (numpy scalars and arrays become JSON numbers and lists), so
       what the folder shows afterwards is this run's alone.

    Parameters
    ----------
    out_dir
        The run's folder (a relative one is relative to the ServerApp
        process's working directory: give an absolute one).
    run
        The run: trains and returns its results (a JSON-able mapping), or
        returns ``None`` when it wrote its own results file.
    results_file
        The file name of the results in ``out_dir``; ``None``: write nothing
        (``run()`` writes its own, after :func:`retire_results`).

    Returns
    -------
    Mapping or None
        What ``run()`` returned.

    Examples
    --------
    >>> import tempfile
    >>> out = Path(tempfile.mkdtemp()) / "run"
    >>> run_in_folder(out, lambda: {"test_accuracy": 0.75})
    {'test_accuracy': 0.75}
    >>> json.loads((out / "results.json").read_text())
    {'test_accuracy': 0.75}
    >>> def fails():
    ...     raise ValueError("labels must lie in [0, 2), got 3")
    >>> run_in_folder(out, fails)
    Traceback (most recent call last):
    ...
    ValueError: labels must lie in [0, 2), got 3
    >>> read_failure(out), sorted(p.name for p in out.iterdir())
    ('ValueError: labels must lie in [0, 2), got 3', ['FAILED', 'results.previous.json'])
    """  # noqa: E501
    created = not Path(out_dir).exists()
    out = private_folder(out_dir)
    try:
        results = run()
    except (ReleaseRefused, ResumeRefused) as err:
        if created:
            _remove_untouched(out)
        log(ERROR, "run refused, nothing sent or written: %s", err)
        raise
    except BaseException as err:
        retire_results(out, keep_previous=True)
        mark_failed(out, "interrupted" if isinstance(err, KeyboardInterrupt) else err)
        log(ERROR, "run failed: %s (%s)", read_failure(out), out / FAILED_FILE)
        raise
    if results_file is not None:  # else run() wrote its own, retiring the old
        retire_results(out, keep_previous=True)
    if results is not None and results_file is not None:
        text = json.dumps(dict(results), indent=2, default=_json_default)
        path = write_atomic(out / results_file, text, mode=FILE_MODE)
        log(INFO, "results in %s", path)
    return results


def _remove_untouched(out: Path) -> None:
    """Remove ``out`` if it holds nothing but empty folders (a refused run's)."""
    for folder in sorted(out.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
            folder.rmdir()
    if not any(out.iterdir()):
        out.rmdir()


def _json_default(value: Any) -> Any:
    """Numpy (and torch) scalars and arrays as JSON numbers and lists."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"results hold a {type(value).__name__}, which is not JSON")
