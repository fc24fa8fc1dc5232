"""The label party's epoch: its steps, the evaluation query, the best-epoch decision.

Functions over a :class:`~tpsl_flwr.strategies.TPSLStrategy`, which calls them
from ``start``; they use only its Flower Strategy methods and public state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from logging import INFO
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from flwr.app import ConfigRecord
from flwr.common.logger import log
from flwr.serverapp import Grid

from tpsl_flwr.attacks.transcript_audit import TranscriptAudit
from tpsl_flwr.errors import ConfigError, PrivacyError
from tpsl_flwr.noise_binding import check_bound
from tpsl_flwr.parties.optim import lr_scale, set_lr_scale
from tpsl_flwr.release_record import check_spend
from tpsl_flwr.strategies.evaluation_query import evaluate, scale_setting
from tpsl_flwr.strategies.exchange import exchange
from tpsl_flwr.strategies.pipeline import train_steps
from tpsl_flwr.wire import protocol as P
from tpsl_flwr.wire.label_side import check_replies, step_message

if TYPE_CHECKING:
    from tpsl_flwr.label_store import Release
    from tpsl_flwr.strategies.tpsl_strategy import TPSLStrategy

__all__ = [
    "StepState",
    "check_release",
    "refuse_configs",
    "restore_release",
    "save_checkpoint",
    "scale_setting",
    "schedule_step",
    "select_epoch",
    "send_to_all",
    "train_epoch",
]


def select_epoch(
    strategy: TPSLStrategy, grid: Grid, epoch: int, score: float, timeout: float
) -> None:
    """Keep ``epoch`` if it is the best so far; the nodes keep and checkpoint."""
    assert strategy.best is not None
    settings: dict[str, int] = {}
    if strategy.best.update(epoch, score, strategy.party):
        settings[P.KEEP_BEST] = epoch
    if strategy.store is not None:
        settings[P.CHECKPOINT_EPOCH] = epoch
    if settings:
        send_to_all(strategy, grid, settings, timeout)


def send_to_all(
    strategy: TPSLStrategy, grid: Grid, settings: dict[str, int], timeout: float
) -> None:
    """One query with ``settings`` (no ids, no gradients) to every node."""
    config: dict[str, int | str] = {P.EPOCH: strategy._state.epoch, P.SPLIT: "test"}
    config.update(settings)
    messages = [
        step_message(n, P.MSG_EMBED_TEST, config, [], []) for n in strategy.nodes
    ]
    replies = exchange(grid, messages, timeout, strategy.poll_interval)
    check_replies(strategy.nodes, replies, [n.node_id for n in strategy.nodes])


def train_epoch(
    strategy: TPSLStrategy, grid: Grid, epoch: int, timeout: float
) -> dict[str, Any]:
    """One epoch of steps, then the evaluation query; the epoch's history entry.

    The entry holds ``epoch`` (1-based), ``seconds``, ``samples``,
    ``samples_per_second``, ``steps`` (the label party's optimizer steps in
    this epoch), ``steps_cumulative`` (since the run began, resumed epochs
    included), the evaluation's metrics and, with ``audit``, ``attack_auc``.
    """
    started = time.perf_counter()
    steps_before = strategy.party.steps
    strategy.begin_epoch(epoch)
    if strategy.audit:
        strategy._audit = TranscriptAudit([(n.offset, n.width) for n in strategy.nodes])
    per_epoch = len(strategy._state.batches) + strategy.pipeline_depth
    server_round = train_steps(strategy, grid, epoch * per_epoch, timeout)
    # The nodes checkpoint with the label party, never without it (after
    # the best-epoch decision, when there is one to keep), and with the
    # evaluation query's last chunk, after every gradient is applied.
    at_end = strategy.store is not None and strategy.best is None
    checkpoint = {P.CHECKPOINT_EPOCH: epoch} if at_end else {}
    metrics = evaluate(strategy, grid, server_round, checkpoint, timeout)
    if strategy.best is not None and metrics is not None:
        score = metrics["validation_loss"]
        assert isinstance(score, float)
        select_epoch(strategy, grid, epoch, score, timeout)
    attacks = None
    if strategy._audit is not None:
        attacks = strategy._audit.epoch_report(strategy.privacy.auc_bound)
    seconds = time.perf_counter() - started
    training = seconds - (attacks["seconds"] if attacks else 0.0)
    entry: dict[str, Any] = {
        "epoch": epoch + 1,
        "seconds": seconds,
        "samples": strategy._state.samples,
        "samples_per_second": strategy._state.samples / training,
        "steps": strategy.party.steps - steps_before,
        "steps_cumulative": strategy.party.steps,
    }
    entry.update(dict(metrics or {}))
    if attacks is not None:
        entry["attack_auc"] = attacks
    return entry


def save_checkpoint(strategy: TPSLStrategy, epoch: int) -> None:
    """With a store: save the label party's state (and best epoch) and history."""
    if strategy.store is not None:
        state = strategy.party.state_dict()
        if strategy.best is not None:
            state["best"] = strategy.best.state_dict()
        strategy.store.save_checkpoint(epoch, strategy.history, state)


def refuse_configs(**given: ConfigRecord | None) -> None:
    """Refuse non-empty configs ``start`` was given: it sends only its own keys."""
    for name, config in given.items():
        if config:
            raise ConfigError(
                f"TPSLStrategy.start does not send {name} ({sorted(config)}): "
                "only the protocol's keys may leave the label party"
            )


def schedule_step(strategy: TPSLStrategy) -> None:
    """Set the learning rate of the label party's next step (and remember it)."""
    if strategy.lr_schedule == "constant":
        return
    total = strategy.epochs * -(-strategy.validation.pool.size // strategy.batch_size)
    strategy._state.scale = lr_scale(strategy.lr_schedule, strategy.party.steps, total)
    set_lr_scale(strategy.party.optimizer, strategy._state.scale)


@dataclass
class StepState:
    """Where the strategy is in the current epoch (label-independent ids only)."""

    epoch: int = 0
    batches: list[np.ndarray] = field(default_factory=list)
    cursor: int = 0
    in_flight: list[np.ndarray] = field(default_factory=list)
    pending: list[tuple[np.ndarray, torch.Tensor]] = field(default_factory=list)
    samples: int = 0
    scale: float = 1.0


def check_release(strategy: TPSLStrategy, release: Release) -> None:
    """Refuse a strategy that would train otherwise than its release says.

    Before any step (the constructor, and ``start`` again after its
    ``num_rounds``): the release's key is the label party's, the party
    states the release's mechanism, parameter, placement and noise reuse
    (:func:`~tpsl_flwr.noise_binding.check_bound`), the strategy spends no
    more releases per label than the ledger recorded, and holds out the
    validation ids the release was bound to.

    Raises
    ------
    PrivacyError
        Naming what differs.
    """
    party = strategy.party
    if release.key != party.key:
        raise PrivacyError(
            f"the release's key ({release.key.fingerprint}) is not the label "
            f"party's ({party.key.fingerprint})"
        )
    check_bound(
        party.key,
        release.binding,
        mechanism=party.mechanism,
        placement=party.placement,
        reuse_noise=party.reuse_noise,
        user="TPSLStrategy",
    )
    check_spend(release.ledger, strategy.privacy)
    opened = release.privacy
    if opened is not None and strategy.privacy.releases > opened.releases:
        raise PrivacyError(
            f"TPSLStrategy spends {strategy.privacy.releases} release(s) per label "
            f"({strategy.epochs} epochs) but its release was opened for "
            f"{opened.releases} ({opened.epochs} epochs): state the release's epochs"
        )
    bound = None if release.binding is None else release.binding.settings
    held_out = strategy.validation.fraction
    if (
        bound is not None
        and "validation-fraction" in bound
        and (float(bound["validation-fraction"]) != held_out)
    ):
        raise PrivacyError(
            f"TPSLStrategy holds out validation-fraction {held_out} but its "
            f"release was bound to {bound['validation-fraction']}: ids whose "
            "noisy labels were released for validation would be trained on (or "
            "the reverse); state the release's value"
        )


def restore_release(strategy: TPSLStrategy, release: Release) -> None:
    """Check the strategy against its release; continue from its saved state.

    Raises
    ------
    PrivacyError
        As :func:`check_release`; nothing is sent then.
    """
    check_release(strategy, release)
    party = strategy.party
    if release.party_state is not None:
        party.load_state_dict(release.party_state)
        strategy.start_epoch = release.start_epoch
        strategy.history = list(release.history)
        if strategy.best is not None and "best" in release.party_state:
            strategy.best.load_state_dict(release.party_state["best"])
        log(
            INFO,
            "resuming after epoch %d of %d (key %s)",
            release.start_epoch,
            strategy.epochs,
            party.key.fingerprint,
        )
    elif release.resumed:
        log(
            INFO,
            "resuming from epoch 1: the run stopped before its first checkpoint "
            "(key %s, the same release)",
            party.key.fingerprint,
        )
