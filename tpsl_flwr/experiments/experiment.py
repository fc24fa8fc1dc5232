"""The label party's side of an experiment: build it, run it, write its results.

Shared by the ServerApp (``flwr run``), the in-process engine and
``tpsl-flwr simulate``; the results JSON has one schema for all of them.
"""

from __future__ import annotations

import copy
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.serverapp import Grid

from tpsl_flwr._util.private_files import write_private
from tpsl_flwr.data.builtin import DATASETS, FILE_DATASETS
from tpsl_flwr.errors import ConfigError, ReleaseRefused
from tpsl_flwr.experiments.architecture import build_top
from tpsl_flwr.experiments.audience import (
    PUBLIC_SUMMARY,
    private_folder,
    write_public,
)
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.run_folder import RESULTS_FILE, retire_results
from tpsl_flwr.experiments.run_report import write_report
from tpsl_flwr.experiments.training_settings import training_of, validation_of
from tpsl_flwr.experiments.wide_settings import resolve_wide, wide_ftrl_settings
from tpsl_flwr.models import num_outputs_for
from tpsl_flwr.parties import LabelParty, adam
from tpsl_flwr.parties.weight_average import resolve_average
from tpsl_flwr.privacy.accounting import PrivacySpent, privacy_spent
from tpsl_flwr.privacy.epsilon_text import has_dp_guarantee, total_text
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms import Mechanism, parameter_of
from tpsl_flwr.release.label_set import MIN_RECORDS
from tpsl_flwr.release.store import LabelRecords, LabelStore, NoiseBinding, Release
from tpsl_flwr.strategies import TPSLStrategy
from tpsl_flwr.strategies.resume_check import GIVEN_KEY

EVALUATION_LABELS = "evaluation-train-labels.npy"
ID_SPACE_KEYS = ("dataset", "data-path", "rows", "seed", "test-fraction", "split")
"""Run-config keys that fix which record each sample id names."""
SEEDED_KEY_NOTE = (
    "the noise key was derived from a seed: the guarantee does not hold against "
    "anyone who knows the seed (they can recompute and subtract the noise)"
)


def provide_seeded_key(cfg: ExperimentConfig) -> None:
    """Leave the label party's own decisions in its folder for the next run.

    The key of ``cfg.noise_seed`` (if any), and the acknowledgement of a
    further release (``cfg.new_release``) with its budget
    (``cfg.privacy_budget``), and whether the run counts as a release
    (``cfg.release``) or may be an unprotected one
    (``cfg.unprotected_release``). Runs on the label party's side only (the CLI, a
    sweep, the in-process engine): none of them enters the run config the
    nodes receive; the ServerApp of ``flwr run`` finds them in the folder. A
    resumed run keeps the key it was bound to, so no key is provided then.
    """
    store = LabelStore(cfg.label_party_dir)
    if cfg.noise_seed >= 0 and not cfg.resume:
        store.provide_key(NoiseKey.from_seed(cfg.noise_seed), origin="seed")
    decided = (cfg.new_release, cfg.release, cfg.unprotected_release)
    if any(decided) or cfg.privacy_budget > 0:
        store.acknowledge_new_release(
            cfg.privacy_budget or None,
            new_release=cfg.new_release,
            unprotected=cfg.unprotected_release,
            release=cfg.release,
        )


def release_request(
    cfg: ExperimentConfig, labels: Any, mechanism: Mechanism
) -> tuple[float, NoiseBinding, LabelRecords, PrivacySpent]:
    """What a run of ``cfg`` asks the ledger for: hold-out, binding, labels, spend.

    Raises
    ------
    ConfigError
        If a data file leaves fewer than ``MIN_RECORDS`` labelled records.
    """
    run_config = cfg.to_run_config()
    # validation-fraction = auto resolved from the public rows, epochs, dataset.
    validation = validation_of(cfg, int(labels.train_labels.size))
    binding = NoiseBinding.of(
        mechanism=mechanism,
        placement=cfg.placement,
        reuse_noise=cfg.reuse_noise,
        id_space={
            **{key: run_config[key] for key in ID_SPACE_KEYS},
            "id-space": labels.id_space,
            # Which ids are held out: a changed hold-out would train on labels
            # already released for validation (and vice versa).
            "validation-fraction": validation,
        },
    )
    records = labels.train_labels.size + labels.test_labels.size
    if cfg.dataset in FILE_DATASETS and records < MIN_RECORDS:
        raise ConfigError(
            f"rows = {cfg.rows} leaves {records} labelled records of {cfg.data_path}: "
            f"the privacy ledger needs at least {MIN_RECORDS} to recognise these "
            "labels in the file's other row limits; use rows >= "
            f"{MIN_RECORDS} (or 0 for the whole file)"
        )
    privacy = privacy_spent(
        mechanism=mechanism,
        placement=cfg.placement,
        epochs=cfg.epochs,
        reuse_noise=cfg.reuse_noise,
    )
    all_labels = LabelRecords.of_splits(
        labels.train_ids, labels.train_labels, labels.test_ids, labels.test_labels
    )
    return validation, binding, all_labels, privacy


def _own_total(spent: PrivacySpent, privacy: dict[str, Any]) -> Any:
    """A run's own pure total: ``inf`` without a pure epsilon, None without DP."""
    if spent.epsilon is not None:
        return privacy["epsilon"]
    return "inf" if has_dp_guarantee(spent.mechanism) else None


def preflight_release(cfg: ExperimentConfig) -> None:
    """Refuse a fresh release, or a resume, before the run's folder is touched.

    The command line's check for ``--release`` runs (every other run of the
    CLI's engines is a rehearsal, which the ledger never refuses) and for
    every resume (:func:`build_strategy` on the dry-run release: the bound
    settings, the key, the checkpoint and the training settings it was
    trained at; the ledger's admission of a resume is left to the run, which
    holds the decisions ``--release`` and ``--unprotected-release`` leave in
    the label party's folder, and refuses before writing): the same decision
    the run's label party takes, taken first without writing, so a refused
    run leaves its ``out-dir`` (and its earlier results) untouched.

    Raises
    ------
    ReleaseRefused, PrivacyError, ConfigError
        As the run would.
    """
    if cfg.resume:  # every check of the resume, on the dry-run release
        try:  # a rehearsal unless --release, as the CLI's engines decide
            build_strategy(cfg, rehearsal=not cfg.release, dry_run=True)
        except ReleaseRefused:
            pass  # the ledger's decision is the run's own, with its decisions
        return
    if not cfg.release:
        return
    labels = cfg.load_labels()
    mechanism = cfg.make_mechanism(labels.num_classes)
    _, binding, records, privacy = release_request(cfg, labels, mechanism)
    LabelStore(cfg.label_party_dir).open_release(
        binding,
        resume=False,
        labels=records,
        privacy=privacy,
        public_labels=cfg.dataset in DATASETS,
        new_release=cfg.new_release,
        budget=cfg.privacy_budget or None,
        unprotected_release=cfg.unprotected_release,
        dry_run=True,
    )


def is_rehearsal(grid: Grid, store: LabelStore) -> bool:
    """Whether the label party started every node of a run on ``grid`` itself.

    Decided from what the label party knows, never from the run config: its
    in-process grid and Flower's Ray simulation (``InMemoryGrid``: the nodes
    are actors of the simulation's own process tree) are rehearsals; a
    deployment (``HttpGrid``) is one only if the label party's own launcher
    left a fresh mark in its folder for this very launch: the mark names the
    launch id the launcher gave every process it started, and this ServerApp
    must have inherited the same (:meth:`LabelStore.mark_rehearsal`, the
    local deployment engine). Any other grid is a release. A mark is taken
    (removed) either way, so that no later run finds it.
    """
    import os

    from flwr.superlink.grid import InMemoryGrid

    from tpsl_flwr.engines.inprocess import InProcessGrid
    from tpsl_flwr.engines.processes import LAUNCH_ID_ENV

    marked = store.take_rehearsal_mark(os.environ.get(LAUNCH_ID_ENV))
    return isinstance(grid, (InProcessGrid, InMemoryGrid)) or marked


def build_strategy(
    cfg: ExperimentConfig, *, rehearsal: bool = False, dry_run: bool = False
) -> tuple[TPSLStrategy, dict[str, Any]]:
    """The label party for ``cfg`` (its labels only) and facts about the data.

    The noise key comes from the label party's private folder
    (:class:`~tpsl_flwr.release.store.LabelStore`), bound to every setting that
    fixes the noise; a resume with any of them changed is refused, and so is
    one whose training settings resolve otherwise than the stopped run's
    (:mod:`~tpsl_flwr.strategies.resume_check`): both decided on a dry-run
    release first, so that a refused resume writes nothing (no ledger entry,
    the label party's decisions kept). ``rehearsal``: every node is the label
    party's own (:func:`is_rehearsal`). ``dry_run`` (a resume's check before
    its folder is touched, :func:`preflight_release`): build the strategy on
    the dry-run release and return it, having written nothing.
    """
    if cfg.resume and not cfg.checkpoint:
        raise ConfigError("resume needs checkpoint = true")
    labels = cfg.load_labels()
    # wide = auto resolved from the training rows, as every node does.
    cfg = resolve_wide(cfg, int(labels.train_labels.size))
    mechanism = cfg.make_mechanism(labels.num_classes)
    top = build_top(cfg, num_outputs_for(labels.num_classes))
    validation, binding, records, privacy = release_request(cfg, labels, mechanism)
    # batch-size / lr = 0 resolved from the training rows, as every node does.
    training = training_of(cfg, int(labels.train_labels.size))
    # average = auto resolved from the epochs, the hold-out (refused first) and
    # the epoch budget; the strategy is given the resolved on/off.
    average_from = resolve_average(
        cfg.average,
        epochs=cfg.epochs,
        held_out=validation > 0,
        still_learning=training.still_learning,
    )
    average = cfg.average
    if average == "auto" and training.still_learning:
        average = "off"
    store = LabelStore(cfg.label_party_dir)
    if not dry_run:
        provide_seeded_key(cfg)
    request: dict[str, Any] = dict(
        resume=cfg.resume,
        labels=records,
        privacy=privacy,
        # Built-in tables are rehearsal data: their labels are public anyway.
        public_labels=cfg.dataset in DATASETS,
        run_name=Path(cfg.out_dir).name,
        rehearsal=rehearsal,
    )
    # What the nodes resolve for the wide part: a resume must keep it too.
    wide: dict[str, Any] = wide_ftrl_settings(
        cfg, int(labels.train_labels.size), heavy_noise=cfg.heavy_label_noise
    )
    if wide:  # and what the run config gave, for the values a refusal names
        given = {"wide-lr": cfg.wide_lr, "wide-l1": cfg.wide_l1, "wide-l2": cfg.wide_l2}
        wide[GIVEN_KEY] = given

    def label_party_on(release: Release, model: torch.nn.Module) -> TPSLStrategy:
        party = LabelParty(
            model,
            labels.train_labels,
            mechanism,
            release.key,
            placement=cfg.placement,
            optimizer=adam(training.lr, cfg.weight_decay),
            reuse_noise=cfg.reuse_noise,
            denoise=cfg.label_denoise,
            denoise_prior=cfg.denoise_prior,
        )
        return TPSLStrategy(
            party,
            test_labels=labels.test_labels,
            batch_size=training.batch_size,
            epochs=cfg.epochs,
            steps_per_message=cfg.steps_per_message,
            pipeline_depth=cfg.pipeline_depth,
            wire_dtype=cfg.wire_dtype,
            order_seed=cfg.seed,
            num_nodes=cfg.num_parties,
            audit=cfg.audit,
            store=store if cfg.checkpoint else None,
            release=release,
            validation_fraction=validation,
            lr_schedule=training.schedule,
            average=average,
            resume_settings=wide,
        )

    if cfg.resume or dry_run:  # every check of the resume, writing nothing
        stopped = store.open_release(binding, dry_run=True, **request)
        checked = label_party_on(stopped, copy.deepcopy(top))
        if dry_run:
            return checked, {}
    release = store.open_release(binding, **request)
    strategy = label_party_on(release, top)
    facts = {
        "dataset": cfg.dataset,
        "num_classes": labels.num_classes,
        "train_rows": int(labels.train_labels.size),
        "test_rows": int(labels.test_labels.size),
        # The resolved wide part (wide = auto): what both sides built.
        "training": {
            **training.to_dict(),
            "validation_fraction": validation,
            # The epochs whose weights every party averages (average = auto).
            "average_epochs": 0 if average_from is None else cfg.epochs - average_from,
            "wide": cfg.wide,
            "wide_optimizer": cfg.wide_optimizer,
        },
        "data_info": {k: _jsonable(v) for k, v in labels.info.items()},
        "key_origin": release.origin,
        "ledger": None if release.ledger is None else release.ledger.to_dict(),
        "run_kind": release.kind,
        "release": release,
    }
    return strategy, facts


def ledger_notes(ledger: dict[str, Any]) -> list[str]:
    """Plain-language notes on the label set's other releases, if any.

    Examples
    --------
    >>> ledger_notes({"earlier_releases": 0, "public_labels": False})
    []
    >>> ledger_notes({"earlier_releases": 2, "public_labels": True,
    ...               "total": {"epsilon": 3.0, "releases": 3}})[0][:42]
    'these labels were released 2 time(s) befor'
    >>> note = ledger_notes({"earlier_releases": 1, "total": {"epsilon": "inf",
    ...     "epsilon_at_delta": 4.377, "delta": 1e-5, "releases": 2}})[0]
    >>> "epsilon_total inf (no pure guarantee; 4.38 at delta 1e-05) over 2" in note
    True
    """
    earlier = ledger.get("earlier_releases", 0)
    notes = []
    if earlier:
        total = ledger["total"]
        notes.append(
            f"these labels were released {earlier} time(s) before under other keys: "
            f"epsilon_total {total_text(*_total_parts(total))} over "
            f"{total['releases']} releases (tpsl-flwr ledger show)"
        )
    if ledger.get("public_labels"):
        notes.append(
            "rehearsal data (a built-in table whose labels are public): its releases "
            "are recorded in the ledger but never refused"
        )
    return notes


def _total_parts(total: dict[str, Any]) -> tuple[Any, Any, Any]:
    return total["epsilon"], total.get("epsilon_at_delta"), total.get("delta")


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return value


def run_label_party(
    grid: Grid, cfg: ExperimentConfig, engine: str, timeout: float | None = None
) -> dict[str, Any]:
    """Run the experiment's label party on ``grid``; write and return the results.

    ``timeout``: seconds to wait for the nodes' replies to each message
    (default ``cfg.reply_timeout``); a node silent that long stops the run.
    """
    started = time.perf_counter()
    store = LabelStore(cfg.label_party_dir)
    strategy, facts = build_strategy(cfg, rehearsal=is_rehearsal(grid, store))
    key_origin = facts.pop("key_origin")
    ledger = facts.pop("ledger")
    release = facts.pop("release")
    wait = cfg.reply_timeout if timeout is None else timeout
    try:
        outcome = strategy.start(grid=grid, timeout=wait)
    except BaseException:
        if not strategy.released_gradients and not release.resumed:
            store.void(release)  # nothing left: the release did not happen
        raise
    spent = strategy.privacy
    privacy = spent.to_dict()
    if not strategy.party.key.secure:
        privacy["notes"] = [*privacy.get("notes", []), SEEDED_KEY_NOTE]
    if ledger is not None:
        privacy["notes"] = [*privacy.get("notes", []), *ledger_notes(ledger)]
    history = strategy.history
    best = strategy.best.epoch if strategy.best is not None else None
    final = strategy.final_metrics  # of the model the run returns
    rates = [h["samples_per_second"] for h in history]
    results: dict[str, Any] = {
        "engine": engine,
        "mechanism": cfg.mechanism,
        "epsilon": cfg.epsilon if parameter_of(cfg.mechanism) == "epsilon" else None,
        "sigma": cfg.sigma if parameter_of(cfg.mechanism) == "sigma" else None,
        "marvell_power": (
            cfg.marvell_power
            if parameter_of(cfg.mechanism) == "marvell_power"
            else None
        ),
        "placement": cfg.placement,
        "epochs": cfg.epochs,
        "epsilon_spent": spent.to_dict()["epsilon"],
        # The pure total, inf (never None) where there is none; empty (None)
        # only for a mechanism with no DP guarantee that no ledger records.
        "epsilon_total": (ledger or {})
        .get("total", {})
        .get("epsilon", _own_total(spent, privacy)),
        "ledger": ledger,
        "privacy": privacy,
        "samples_per_second": float(np.mean(rates)) if rates else 0.0,
        "seconds": time.perf_counter() - started,
        "num_parties": len(strategy.nodes),
        "noise_key": {
            "secure": strategy.party.key.secure,
            "origin": key_origin,
            "fingerprint": strategy.party.key.fingerprint,
            "note": None if strategy.party.key.secure else SEEDED_KEY_NOTE,
        },
        "config": cfg.to_run_config(),
        "history": history,
        "best_epoch": None if best is None else best + 1,
        "averaged": strategy.averaged,
        "validation_rows": int(strategy.validation.ids.size),
        "epochs_trained": outcome.epochs_trained,
        "note": outcome.note,
        **facts,
    }
    for key in ("test_auc", "test_accuracy", "test_logloss"):
        if key in final:
            results[key] = final[key]
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.transcript_dir:
        # Ground truth for scoring the recorded transcript offline
        # (`tpsl-flwr attack`): the experimenter's file, kept in the label
        # party's private folder, never sent.
        path = LabelStore(cfg.label_party_dir).save_labels(
            EVALUATION_LABELS, strategy.party.labels.astype(np.int64)
        )
        results["evaluation_labels"] = str(path)
    write_results(results, out)
    return results


def write_results(results: dict[str, Any], out: Path) -> None:
    """Write the report, the public summary, then ``results.json``, atomically.

    ``out`` is made the label party's (mode ``0700``): ``report.md``,
    ``report.png`` and ``results.json`` hold clean-label statistics and are
    written ``0600``; ``summary-public.json`` (``0644``) holds only the fields
    :data:`~tpsl_flwr.experiments.audience.PUBLIC_FIELDS` allows.
    ``results.json`` comes last: its presence says the run finished (sweeps
    skip such runs), and a crash never leaves a half-written one.
    """
    folder = private_folder(out)
    retire_results(folder, keep_previous=True)  # an earlier run's: *.previous.*
    write_report(results, folder)
    write_public(folder / PUBLIC_SUMMARY, results)
    text = json.dumps(results, indent=2, default=_jsonable)
    write_private(folder / RESULTS_FILE, text.encode())
