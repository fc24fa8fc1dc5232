"""The label party's epochs in Flower: steps, evaluation query, best epoch.

:class:`EpochLoop` owns the step state of the current epoch
(:class:`~tpsl_flwr.strategies.step_state.StepState`), the transcript audit and
the evaluation query; the strategy hands it the nodes and the grid with each
call, and its own ``configure_train``/``aggregate_train`` (Flower's hooks, so a
subclass that overrides them is still the one called) for the train round trips
(:mod:`~tpsl_flwr.strategies.pipeline`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from flwr.app import Message, MetricRecord
from flwr.serverapp import Grid

from tpsl_flwr.attacks.transcript_audit import TranscriptAudit
from tpsl_flwr.errors import ResumeRefused
from tpsl_flwr.parties import LabelParty
from tpsl_flwr.parties.model_state import load_checkpoint_state
from tpsl_flwr.parties.optim import lr_scale, set_lr_scale
from tpsl_flwr.parties.training_rules import CYCLE_EPOCHS
from tpsl_flwr.parties.weight_average import fold_average
from tpsl_flwr.strategies.evaluation_query import EvaluationQuery
from tpsl_flwr.strategies.exchange import exchange
from tpsl_flwr.strategies.pipeline import Aggregate, Configure, train_steps
from tpsl_flwr.strategies.step_state import StepState, scale_setting
from tpsl_flwr.validation.holdout import Validation
from tpsl_flwr.wire import protocol as P
from tpsl_flwr.wire.label_side import (
    Node,
    check_echo,
    check_replies,
    gather_embeddings,
    step_message,
)

__all__ = ["EpochLoop"]


class EpochLoop:
    """The steps of each epoch, the evaluation query and the best-epoch decision.

    Parameters
    ----------
    party
        The label party: labels, top model, mechanism, noise key.
    validation
        The run's held-out ids and best epoch
        (:class:`~tpsl_flwr.validation.holdout.Validation`).
    test_labels
        Labels of the test ids; ``None``: no test metrics.
    batch_size, steps_per_message, order_seed, lr_schedule, pipeline_depth,
    wire_dtype, poll_interval, audit
        As :class:`~tpsl_flwr.strategies.TPSLStrategy` takes them.
    checkpoints
        Whether the label party keeps a store: the nodes then checkpoint
        with it every epoch.
    average_from
        The first epoch (0-based) whose weights every party folds into its
        tail average (:mod:`~tpsl_flwr.parties.weight_average`); ``None``:
        no average.
    """

    def __init__(
        self,
        party: LabelParty,
        validation: Validation,
        test_labels: np.ndarray | None,
        *,
        batch_size: int,
        steps_per_message: int,
        order_seed: int,
        lr_schedule: str,
        pipeline_depth: int,
        wire_dtype: str,
        poll_interval: float,
        audit: bool,
        checkpoints: bool,
        average_from: int | None = None,
    ) -> None:
        self.party = party
        self.validation = validation
        self.batch_size = batch_size
        self.steps_per_message = steps_per_message
        self.order_seed = order_seed
        self.lr_schedule = lr_schedule
        self.pipeline_depth = pipeline_depth
        self.wire_dtype = wire_dtype
        self.poll_interval = poll_interval
        self.audit_each_epoch = audit
        self.checkpoints = checkpoints
        self.average_from = average_from
        self.average: dict[str, torch.Tensor] | None = None
        """The running average of the top model's weights (``average_from``)."""
        self.averaged = 0
        """The epochs folded into :attr:`average` (each node holds as many)."""
        self.server_round = 0
        """The last round of train messages sent."""
        self.state = StepState()
        self.audit: TranscriptAudit | None = None
        """This epoch's transcript audit (``audit`` on), else ``None``."""
        self.released = False
        """True once a perturbed gradient was made for the nodes."""
        self.query = EvaluationQuery(
            party,
            validation,
            test_labels,
            wire_dtype=wire_dtype,
            lr_schedule=lr_schedule,
            poll_interval=poll_interval,
        )

    @property
    def best(self) -> Any:
        """The best epoch kept so far, or ``None`` when nothing is held out."""
        return self.validation.best if self.validation.active else None

    def check_resumed_batch(self, stopped: Any) -> None:
        """Refuse to resume with batches of another size than the checkpoint's.

        The label party's step count comes back from the checkpoint, and the
        learning-rate schedule places the resumed steps by the batches an epoch
        now has: with another batch size a cosine would not end at the last
        step, nor a ``restarts`` cycle at the end of its second epoch.
        ``stopped`` is ``None`` for a checkpoint that did not record it.

        Raises
        ------
        ResumeRefused
            Naming both sizes.
        """
        if stopped is not None and int(stopped) != self.batch_size:
            raise ResumeRefused(
                f"cannot resume: the stopped run took batches of {int(stopped)} ids "
                f"and this one takes {self.batch_size} (batch-size): its steps and "
                f"learning-rate schedule count batches of {int(stopped)}; resume "
                f"with batch-size = {int(stopped)}"
            )

    # ------------------------------------------------------------- one epoch
    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """The epoch's batches (pool dtype), shuffled by ``(order_seed, epoch)``."""
        rng = np.random.default_rng([self.order_seed, epoch])
        pool = self.validation.pool
        order = pool[rng.permutation(pool.size)]
        return [
            order[i : i + self.batch_size]
            for i in range(0, order.size, self.batch_size)
        ]

    def begin_epoch(self, epoch: int, epochs: int) -> None:
        """Start ``epoch`` of ``epochs``: its label-independent batches, none due."""
        total = epochs * -(-self.validation.pool.size // self.batch_size)
        self.state = StepState(
            epoch=epoch, batches=self.epoch_batches(epoch), total_steps=total
        )

    def train_messages(self, nodes: list[Node], server_round: int) -> list[Message]:
        """Messages carrying the pending perturbed gradients and the next ids."""
        state = self.state
        upto = state.cursor + self.steps_per_message  # ids go out as int64
        state.in_flight = [
            b.astype(np.int64) for b in state.batches[state.cursor : upto]
        ]
        state.cursor += len(state.in_flight)
        settings = {P.EPOCH: state.epoch, P.ROUND: server_round, P.SPLIT: "train"}
        settings.update(scale_setting(state, self.lr_schedule))
        messages = [
            step_message(
                n,
                P.MSG_TRAIN,
                settings,
                state.in_flight,
                state.pending,
                self.wire_dtype,
            )
            for n in nodes
        ]
        state.pending = []  # dispatched
        return messages

    def train_replies(
        self, nodes: list[Node], replies: Iterable[Message]
    ) -> MetricRecord:
        """Run GradPerturb steps on the returned embeddings; stash the gradients."""
        state = self.state
        by_node = check_replies(nodes, replies, [n.node_id for n in nodes])
        embeddings = gather_embeddings(nodes, by_node, state.in_flight)
        for ids, emb in zip(state.in_flight, embeddings, strict=True):
            self.schedule_step()
            if self.audit is not None:
                grad = self.audit.step(self.party, ids, emb, state.epoch)
            else:
                grad = self.party.train_step(ids, emb, epoch=state.epoch)
            state.pending.append((ids, grad))
            self.released = True
            state.samples += ids.size
        return MetricRecord({"samples": state.samples})

    def schedule_step(self) -> None:
        """Set the learning rate of the label party's next step (and remember it)."""
        if self.lr_schedule == "constant":
            return
        state = self.state
        per_epoch = -(-self.validation.pool.size // self.batch_size)
        state.scale = lr_scale(
            self.lr_schedule,
            self.party.steps,
            state.total_steps,
            cycle_steps=CYCLE_EPOCHS * per_epoch,  # restarts: 2 epochs a cycle
        )
        set_lr_scale(self.party.optimizer, state.scale)

    def run_epoch(
        self,
        grid: Grid,
        nodes: list[Node],
        epoch: int,
        timeout: float,
        *,
        epochs: int,
        auc_bound: float | None,
        configure: Configure,
        aggregate: Aggregate,
    ) -> dict[str, Any]:
        """One epoch of steps, then the evaluation query; the epoch's history entry.

        ``configure`` and ``aggregate`` are the strategy's ``configure_train``
        and ``aggregate_train``; ``auc_bound`` is the run's attack ceiling
        (for the audit). The entry holds ``epoch`` (1-based), ``seconds``,
        ``samples``, ``samples_per_second``, ``steps`` (the label party's
        optimizer steps in this epoch), ``steps_cumulative`` (since the run
        began, resumed epochs included), the evaluation's metrics and, with
        ``audit``, ``attack_auc``.
        """
        started = time.perf_counter()
        steps_before = self.party.steps
        self.begin_epoch(epoch, epochs)
        if self.audit_each_epoch:
            self.audit = TranscriptAudit([(n.offset, n.width) for n in nodes])
        per_epoch = len(self.state.batches) + self.pipeline_depth
        server_round = train_steps(
            self.state,
            grid,
            epoch * per_epoch,
            timeout,
            depth=self.pipeline_depth,
            poll_interval=self.poll_interval,
            epochs=epochs,
            configure=configure,
            aggregate=aggregate,
        )
        # The nodes checkpoint with the label party, never without it (after
        # the best-epoch decision, when there is one to keep), and with the
        # evaluation query's last chunk, after every gradient is applied.
        self.server_round = server_round
        best = self.best
        at_end = self.checkpoints and best is None
        checkpoint: dict[str, int] = {P.CHECKPOINT_EPOCH: epoch} if at_end else {}
        echo: dict[str, int] = {}
        if self.average_from is not None and epoch >= self.average_from:
            # Every party folds the epoch's weights in after its last gradient:
            # the label party now, each node with the query's last chunk, and
            # each node says it did, holding as many epochs as the label party.
            self.fold_average()
            checkpoint[P.AVERAGE_IN] = epoch
            echo = {P.AVERAGE_IN: epoch, P.AVERAGED: self.averaged}
        metrics = self.query.run(
            self.state, grid, nodes, server_round, checkpoint, timeout, echo
        )
        if best is not None and metrics is not None:
            score = metrics["validation_loss"]
            assert isinstance(score, float)
            candidate = self.ends_cycle(epoch, epochs)
            self.select_epoch(grid, nodes, epoch, score, timeout, candidate)
        attacks = None
        if self.audit is not None:
            attacks = self.audit.epoch_report(auc_bound)
        seconds = time.perf_counter() - started
        training = seconds - (attacks["seconds"] if attacks else 0.0)
        entry: dict[str, Any] = {
            "epoch": epoch + 1,
            "seconds": seconds,
            "samples": self.state.samples,
            "samples_per_second": self.state.samples / training,
            "steps": self.party.steps - steps_before,
            "steps_cumulative": self.party.steps,
        }
        entry.update(dict(metrics or {}))
        if attacks is not None:
            entry["attack_auc"] = attacks
        return entry

    # ------------------------------------------------------- the tail average
    def fold_average(self) -> None:
        """Fold the top model's current weights into the running average."""
        weights = self.party.top.state_dict()
        self.average = fold_average(self.average, weights, self.averaged)
        self.averaged += 1

    def restore_average(
        self, grid: Grid, nodes: list[Node], timeout: float
    ) -> MetricRecord | None:
        """Every party loads its average; the evaluation query of the averaged model.

        The nodes are told how many epochs their average must hold, up to which
        epoch (the message's ``epoch``), and refuse to load another (a
        ``ProtocolError`` there); each reply must echo the count it restored
        (:func:`~tpsl_flwr.wire.label_side.check_echo`), or nothing averaged
        is reported.
        """
        assert self.average is not None and self.average_from is not None
        last = self.average_from + self.averaged - 1  # the epochs follow one another
        restore = {P.EPOCH: last, P.RESTORE_AVERAGE: self.averaged}
        echo = {P.RESTORE_AVERAGE: self.averaged}
        self.send_to_all(grid, nodes, restore, timeout, echo)
        load_checkpoint_state(self.party.top, self.average, "averaged top model")
        self.server_round += 1
        return self.query.run(self.state, grid, nodes, self.server_round, {}, timeout)

    def average_state(self) -> dict[str, Any] | None:
        """The running average for the label party's checkpoint, or ``None``."""
        if self.average is None:
            return None
        return {"weights": self.average, "count": self.averaged}

    def load_average_state(self, state: dict[str, Any] | None) -> None:
        """Restore :meth:`average_state` (a resumed run)."""
        if state is None:
            self.average, self.averaged = None, 0
        else:
            self.average, self.averaged = dict(state["weights"]), int(state["count"])

    # ------------------------------------------------------- the best epoch
    def ends_cycle(self, epoch: int, epochs: int) -> bool:
        """Whether ``epoch`` (0-based) of ``epochs`` ends a learning-rate cycle.

        Under ``restarts`` the models of the epochs that end a cycle (every
        :data:`~tpsl_flwr.parties.training_rules.CYCLE_EPOCHS`-th, and the
        last) were trained down to a rate near 0; the others stop half-way
        down, at half the rate (Loshchilov and Hutter, "SGDR", ICLR 2017,
        Section 3: the snapshots are the ends of the cycles). Every epoch ends
        one under the other schedules.
        """
        if self.lr_schedule != "restarts":
            return True
        return (epoch + 1) % CYCLE_EPOCHS == 0 or epoch + 1 == epochs

    def select_epoch(
        self,
        grid: Grid,
        nodes: list[Node],
        epoch: int,
        score: float,
        timeout: float,
        candidate: bool = True,
    ) -> None:
        """Keep ``epoch`` if it is the best so far; the nodes keep and checkpoint.

        ``candidate``: whether ``epoch`` may be kept (:meth:`ends_cycle`);
        its score is reported either way.
        """
        best = self.best
        assert best is not None
        settings: dict[str, int] = {}
        if not candidate:
            best.pending = best.pending_classes = None
        elif best.update(epoch, score, self.party):
            settings[P.KEEP_BEST] = epoch
        if self.checkpoints:
            settings[P.CHECKPOINT_EPOCH] = epoch
        if settings:
            self.send_to_all(grid, nodes, settings, timeout)

    def send_to_all(
        self,
        grid: Grid,
        nodes: list[Node],
        settings: dict[str, int],
        timeout: float,
        echo: dict[str, int] | None = None,
    ) -> None:
        """One query with ``settings`` (no ids, no gradients) to every node.

        ``echo``: what every reply must confirm
        (:func:`~tpsl_flwr.wire.label_side.check_echo`).
        """
        config: dict[str, int | str] = {P.EPOCH: self.state.epoch, P.SPLIT: "test"}
        config.update(settings)
        messages = [step_message(n, P.MSG_EMBED_TEST, config, [], []) for n in nodes]
        replies = exchange(grid, messages, timeout, self.poll_interval)
        by_node = check_replies(nodes, replies, [n.node_id for n in nodes])
        if echo:
            check_echo(nodes, by_node, echo)
