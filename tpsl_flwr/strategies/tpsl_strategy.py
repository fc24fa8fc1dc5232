"""TPSLStrategy: the label party of vertical split learning as a Flower Strategy.

One Flower round trip per step (or per ``K`` steps): ``configure_train`` sends
each non-label node its slice of the *perturbed* cut-layer gradient of the
previous step together with the sample ids of the next step;
``aggregate_train`` concatenates the returned embeddings, runs the top model,
applies GradPerturb (Yang et al., Algorithm 3 / Section 4.2) and stashes the
next gradients. Test embeddings come back through ``query`` messages and test
metrics are computed at the label party only: nothing derived from labels but
the perturbed gradients ever leaves it.

With ``steps_per_message = K > 1`` a message carries ``K`` batches: the node
embeds all ``K`` with the same bottom parameters, so batch ``j`` of a message
is embedded ``j`` bottom updates earlier than sequential split learning would
(staleness up to ``K - 1`` steps), and when the node applies the ``K``
gradients it recomputes each batch's forward pass with its current, already
updated, parameters. ``K = 1`` is exact sequential split learning.
``pipeline_depth = d > 0`` keeps ``d + 1`` messages in flight per node: the
bottom models embed ``d`` steps stale (:mod:`~tpsl_flwr.strategies.pipeline`).

The strategy holds the run (its settings, nodes, history, release); each
epoch's steps, evaluation query and best-epoch decision are its
:class:`~tpsl_flwr.strategies.epoch_loop.EpochLoop`, which owns the step state
and is handed the nodes and the grid with each call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from logging import INFO
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from tpsl_flwr._util.checks import check_int, check_positive_finite
from tpsl_flwr.errors import ConfigError, PrivacyError
from tpsl_flwr.parties import LabelParty
from tpsl_flwr.parties.optim import lr_scale
from tpsl_flwr.parties.weight_average import (
    average_mode,
    check_resumed_average,
    resolve_average,
    stopped_average,
)
from tpsl_flwr.privacy.accounting import PrivacySpent, privacy_spent
from tpsl_flwr.release.store import LabelStore, Release
from tpsl_flwr.strategies.epoch_log import (
    TPSLResult,
    begin_result,
    log_settings,
    progress_line,
    record_epoch,
)
from tpsl_flwr.strategies.epoch_loop import EpochLoop
from tpsl_flwr.strategies.exchange import MAX_INTERVAL, exchange
from tpsl_flwr.strategies.for_labels import for_labels as _for_labels
from tpsl_flwr.strategies.node_count import refuse_extra_nodes, wait_for_nodes
from tpsl_flwr.strategies.release_check import check_release, refuse_configs
from tpsl_flwr.strategies.resume_check import (
    SETTINGS_KEY,
    check_resumed_settings,
    resolved_settings,
)
from tpsl_flwr.validation.best_epoch import BestEpoch
from tpsl_flwr.validation.holdout import Validation, resolve_validation
from tpsl_flwr.validation.scores import check_validation_mechanism
from tpsl_flwr.wire import protocol as P
from tpsl_flwr.wire.label_side import (
    Node,
    check_sample_counts,
    check_top_model,
    describe_nodes,
    hello_messages,
)
from tpsl_flwr.wire.wire_dtype import check_wire_dtype

EpochCallback = Callable[[int, dict[str, Any]], None]


class TPSLStrategy(Strategy):
    """The label party P_L as a Flower strategy.

    Parameters
    ----------
    label_party
        Labels, top model, optimizer, mechanism and noise key.
    test_labels
        Labels of the test samples (ids ``0..n_test-1`` at every node), for
        evaluation at the label party; ``None`` skips evaluation.
    batch_size
        Samples per step.
    epochs
        Passes over the training ids (one Flower "round" of this strategy).
    steps_per_message
        ``K`` batches per message (see the module docstring on staleness).
    order_seed
        Seed of the per-epoch shuffle of sample ids (label-independent).
    num_nodes
        Non-label parties to wait for; ``None`` uses those present at start.
    on_epoch_end
        Called with ``(epoch, record)`` after each epoch's evaluation and
        checkpoint; ``record`` is the epoch's history entry.
    node_wait
        Seconds to wait for ``num_nodes`` nodes to register (sooner where
        all register at once: :mod:`~tpsl_flwr.strategies.node_count`).
    audit
        Attack the dispatched transcript every epoch (norm, cosine, spectral,
        white-box SDA) on a bounded sample of its batches
        (:mod:`~tpsl_flwr.attacks.reservoir`) and add ``attack_auc`` to each
        epoch's history entry. Off by default: each sampled batch costs ``k``
        extra backward passes.
    poll_interval
        Longest sleep, in seconds, between two pulls for the nodes' replies
        (:func:`~tpsl_flwr.strategies.exchange.exchange`; Flower's own
        ``send_and_receive`` sleeps 0.1 s in simulation and 3 s in deployment).
    store
        The label party's private folder
        (:class:`~tpsl_flwr.release.store.LabelStore`): with it, the strategy
        checkpoints after every epoch (top model, optimizer, history; the key
        stays in its own file) and the nodes checkpoint their bottom models.
    release
        What ``LabelStore.open_release`` returned for this run: its ledger
        total is logged; on resume the party's state, the epochs done and
        their history are restored from it and the nodes told to load their
        checkpoints. Its key must be ``label_party``'s.
    validation_fraction
        Hold out this fraction of the training ids, by a hash of the id alone,
        score every epoch on their noisy labels and restore the best epoch's
        models at the end (:mod:`~tpsl_flwr.validation.best_epoch`); 0: train
        on every id and keep the last epoch; ``"auto"``: the rule of
        :func:`~tpsl_flwr.validation.holdout.resolve_validation` from the
        training rows, epochs and mechanism, for data of hashed codes (the
        run config also reads its dataset: ``validation_of`` in
        :mod:`~tpsl_flwr.experiments.training_settings`, and passes the
        resolved number).
    lr_schedule
        ``constant``, ``cosine`` or ``restarts`` (a cosine cycle every
        :data:`~tpsl_flwr.parties.training_rules.CYCLE_EPOCHS` epochs;
        :func:`~tpsl_flwr.parties.optim.lr_scale`); each message tells the
        nodes the scale of the gradients it carries.
    pipeline_depth
        ``d``: push train message ``k + d`` before pulling reply ``k``, so the
        bottom models embed ``d`` steps stale; 0: sequential (the default).
    wire_dtype
        ``float32`` (the default) or ``float16``: the dtype the perturbed
        gradient slices go in, cast after perturbation (post-processing,
        :mod:`~tpsl_flwr.wire.wire_dtype`).
    average
        ``on``: every party returns the mean of its weights after every
        epoch but the first (its own weights only: the label party its
        top model, each node its bottom model; the label party says when),
        and the results report that model's metrics (``averaged``); ``auto``:
        on for runs of at least 5 epochs without a hold-out (``for_labels``
        and ``simulate`` pass ``off`` where the epoch budget leaves the model
        still learning: :func:`~tpsl_flwr.parties.weight_average.resolve_average`);
        ``off`` (the default): the last or the restored best epoch.
    resume_settings
        Settings resolved for the nodes that a resume must keep (the wide
        part's FTRL rate and penalties), checkpointed with the label party's
        optimizer's (:mod:`~tpsl_flwr.strategies.resume_check`).

    See ``docs/embedding.md`` for the contracts of both parties and for
    resuming an embedded run. :meth:`for_labels` builds the label party,
    its store and its release in one call.
    """

    for_labels = classmethod(_for_labels)  # type: ignore[var-annotated]

    def __init__(
        self,
        label_party: LabelParty,
        *,
        test_labels: np.ndarray | None = None,
        batch_size: int = 256,
        epochs: int = 1,
        steps_per_message: int = 1,
        order_seed: int = 0,
        num_nodes: int | None = None,
        on_epoch_end: EpochCallback | None = None,
        node_wait: float = 60.0,
        audit: bool = False,
        poll_interval: float = MAX_INTERVAL,
        store: LabelStore | None = None,
        release: Release | None = None,
        validation_fraction: float | str = 0.0,
        lr_schedule: str = "constant",
        pipeline_depth: int = 0,
        wire_dtype: str = "float32",
        average: str | bool = "off",
        resume_settings: Mapping[str, Any] | None = None,
    ) -> None:
        for name, value in (
            ("batch_size", batch_size),
            ("epochs", epochs),
            ("steps_per_message", steps_per_message),
        ):
            check_int(value, name)
        self.pipeline_depth = check_int(pipeline_depth, "pipeline_depth", 0)
        self.wire_dtype = check_wire_dtype(wire_dtype)
        if num_nodes is not None:
            check_int(num_nodes, "num_nodes")
        self.poll_interval = check_positive_finite(poll_interval, "poll_interval")
        if release is not None and release.resumed and store is None:
            raise ConfigError(
                f"release {release.key.fingerprint} resumes a run: pass the store "
                "it was opened from (store=LabelStore(label_dir)); without it "
                "this run's epochs would not be checkpointed, and the next resume "
                "would train them again under the same key"
            )
        self.party = label_party
        self.test_labels = test_labels
        self.batch_size = batch_size
        self.epochs = epochs
        self.steps_per_message = steps_per_message
        self.order_seed = order_seed
        self.num_nodes = num_nodes
        self.on_epoch_end = on_epoch_end
        self.node_wait = node_wait
        self.audit = audit
        self.nodes: list[Node] = []
        self.history: list[dict[str, Any]] = []
        self.start_epoch = 0
        self.store = store
        self._resumed = release is not None and release.resumed
        self.lr_schedule = lr_schedule
        lr_scale(lr_schedule, 0, 1)  # refuses an unknown schedule
        fraction = resolve_validation(  # "auto" as for a file of hashed codes
            validation_fraction,
            train_rows=self.num_train,
            epochs=self.epochs,
            mechanism=self.party.mechanism.name,
        )
        self.validation = Validation(self.num_train, fraction, order_seed)
        self.best: BestEpoch | None = (
            self.validation.best if self.validation.active else None
        )
        if self.validation.active:
            check_validation_mechanism(label_party.mechanism)  # before any step
            label_party.hold_out(self.validation.ids)
        self.average = average_mode(average)
        self._stopped_average: int | None = None
        """The checkpoint's resolved ``average`` (its first averaged epoch)."""
        self._from_checkpoint = False
        """Whether the run resumes from a checkpoint (whose average it keeps)."""
        self.averaged: dict[str, Any] | None = None
        """The metrics of the averaged model the run returns (``None``: none)."""
        self.loop = EpochLoop(
            label_party,
            self.validation,
            test_labels,
            batch_size=batch_size,
            steps_per_message=steps_per_message,
            order_seed=order_seed,
            lr_schedule=lr_schedule,
            pipeline_depth=self.pipeline_depth,
            wire_dtype=self.wire_dtype,
            poll_interval=self.poll_interval,
            audit=audit,
            checkpoints=store is not None,
            average_from=self.average_from,
        )
        """The epochs' steps, evaluation query and best-epoch decision."""
        # What a resume must keep, read before a checkpoint's optimizer loads.
        self.settings = resolved_settings(label_party.optimizer, resume_settings)
        self._release = release
        if release is not None:
            self.restore_release(release)
        elif label_party.key.binding is not None:
            raise PrivacyError(
                f"the label party's key ({label_party.key.fingerprint}) belongs to "
                "a release: pass it as release=..., so the strategy is checked "
                "against what the ledger recorded"
            )

    @property
    def final_metrics(self) -> dict[str, Any]:
        """The metrics of the model the run returns (after :meth:`start`).

        The averaged model's (:attr:`averaged`, ``average`` on), else the
        restored best epoch's (a hold-out), else the last epoch's history
        entry; empty before any epoch.
        """
        if self.averaged is not None:
            return dict(self.averaged)
        if self.best is not None and self.best.epoch is not None:
            return dict(self.history[self.best.epoch])
        return dict(self.history[-1]) if self.history else {}

    @property
    def average_from(self) -> int | None:
        """The first epoch (0-based) the parties average over, or ``None``."""
        return resolve_average(
            self.average, epochs=self.epochs, held_out=self.validation.active
        )

    @property
    def released_gradients(self) -> bool:
        """True once a perturbed gradient was made for the nodes (it may have left).

        A fresh release that fails before is voided; a resumed one was made.
        """
        return self._resumed or self.loop.released

    @property
    def release(self) -> Release | None:
        """The release this strategy trains under (None: a key of its own)."""
        return self._release

    @property
    def privacy(self) -> PrivacySpent:
        """The privacy this run spends per label (for ``self.epochs`` epochs)."""
        return privacy_spent(
            mechanism=self.party.mechanism,
            placement=self.party.placement,
            epochs=self.epochs,
            reuse_noise=self.party.reuse_noise,
        )

    # ------------------------------------------------------------------ setup
    @property
    def num_train(self) -> int:
        """Number of training samples (the label party's labels)."""
        return int(self.party.labels.size)

    def begin_epoch(self, epoch: int) -> None:
        """Start ``epoch``: its label-independent batches, no gradient pending."""
        self.loop.begin_epoch(epoch, self.epochs)

    @property
    def pending(self) -> list[tuple[np.ndarray, torch.Tensor]]:
        """Perturbed gradients computed but not yet dispatched: ``(ids, grad)``."""
        return list(self.loop.state.pending)

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """The epoch's batches (pool dtype), shuffled by ``(order_seed, epoch)``."""
        return self.loop.epoch_batches(epoch)

    def summary(self) -> None:
        """Log the strategy's settings as a tree, like Flower's DP wrappers."""
        log_settings(
            self.party,
            self.privacy,
            epochs=self.epochs,
            batch_size=self.batch_size,
            steps_per_message=self.steps_per_message,
            ledger=None if self._release is None else self._release.ledger,
        )

    def connect(
        self, grid: Grid, timeout: float, resume_epoch: int | None = None
    ) -> None:
        """Wait for the nodes, learn each one's partition and embedding width.

        Before any step, refuse (naming the node or the model and both
        numbers) nodes whose train or test split is not the label party's ids
        ``0..n-1``, and a top model that does not take the nodes' total width
        or does not return the logits the labels need (one no-grad forward of
        a zeros row).
        """
        node_ids = wait_for_nodes(grid, self.num_nodes, self.node_wait)
        hello = hello_messages(  # may start each node's app
            node_ids, resume_epoch, checkpoints=self.store is not None
        )
        replies = exchange(grid, hello, timeout + self.node_wait, self.poll_interval)
        nodes = describe_nodes(replies, node_ids, self.num_nodes)
        refuse_extra_nodes(nodes, self.num_nodes)
        n_test = None if self.test_labels is None else int(self.test_labels.size)
        check_sample_counts(nodes, num_train=self.num_train, num_test=n_test)
        check_top_model(self.party.top, nodes, self.party.num_outputs)
        self.nodes = nodes

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Messages carrying the pending perturbed gradients and the next ids."""
        return self.loop.train_messages(self.nodes, server_round)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Run GradPerturb steps on the returned embeddings; stash the gradients."""
        return None, self.loop.train_replies(self.nodes, replies)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Query every evaluation id in one message (``start`` sends chunks).

        The message also flushes the pending gradients
        (:mod:`~tpsl_flwr.strategies.evaluation_query`).
        """
        query, state = self.loop.query, self.loop.state
        ids, splits = query.ids()
        return query.messages(
            state, self.nodes, server_round, dict(config), ids, splits
        )

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Test metrics computed at the label party from the test embeddings."""
        query = self.loop.query
        accumulator = query.accumulator()
        ids, splits = query.ids()
        query.absorb(self.loop.state, accumulator, self.nodes, replies, ids, splits)
        return accumulator.result()

    # -------------------------------------------------------------------- run
    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord | None = None,
        num_rounds: int | None = None,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> TPSLResult:
        """Train for ``num_rounds`` epochs (default: the constructor's ``epochs``).

        Flower's arguments: ``initial_arrays``, if given, is loaded into the
        top model; ``num_rounds`` counts epochs; ``evaluate_fn(epoch, arrays)``
        is called with the top model after each epoch and its metrics join the
        epoch's history entry and ``evaluate_metrics_serverapp``.
        ``train_config`` and ``evaluate_config`` are refused when non-empty:
        only the protocol's own keys may leave the label party.

        Returns
        -------
        TPSLResult
            A Flower ``Result`` (top model arrays, per-epoch throughput in
            ``train_metrics_clientapp``, per-epoch test metrics computed at the
            label party in ``evaluate_metrics_serverapp``) that also carries
            ``privacy``, ``epsilon_spent`` and ``epochs_trained``.

        Raises
        ------
        ConfigError
            For a non-empty ``train_config`` or ``evaluate_config``.
        PrivacyError
            If the strategy, with ``num_rounds``, or its party no longer
            match the release
            (:func:`~tpsl_flwr.strategies.release_check.check_release`).
        """
        refuse_configs(train_config=train_config, evaluate_config=evaluate_config)
        if num_rounds is not None:
            check_int(num_rounds, "num_rounds")
            self.epochs = num_rounds
            self.check_resumed_average()
            self.loop.average_from = self.average_from
        if initial_arrays is not None and len(initial_arrays):
            self.party.top.load_state_dict(initial_arrays.to_torch_state_dict())
        if self._release is not None:  # num_rounds, or a party changed since
            self.check_release(self._release)
        log(INFO, "Starting TPSLStrategy (label party):")
        self.summary()
        resume = self.start_epoch if self.start_epoch > 0 else None
        self.connect(grid, timeout, resume_epoch=resume)
        log(
            INFO,
            "Connected to %s non-label nodes; cut layer width %s",
            len(self.nodes),
            sum(n.width for n in self.nodes),
        )
        ledger = None if self._release is None else self._release.ledger
        result = begin_result(self.privacy, self.epochs, self.start_epoch, ledger)
        for past in self.history:
            record_epoch(result, past)
        for epoch in range(self.start_epoch, self.epochs):
            entry = self.loop.run_epoch(
                grid,
                self.nodes,
                epoch,
                timeout,
                epochs=self.epochs,
                auc_bound=self.privacy.auc_bound,
                configure=self.configure_train,
                aggregate=self.aggregate_train,
            )
            if evaluate_fn is not None:
                arrays = ArrayRecord(self.party.top.state_dict())
                entry.update(dict(evaluate_fn(epoch + 1, arrays) or {}))
            self.history.append(entry)
            record_epoch(result, entry)
            log(INFO, "epoch %d/%d  %s", epoch + 1, self.epochs, progress_line(entry))
            self.save_checkpoint(epoch)
            if self.on_epoch_end is not None:
                self.on_epoch_end(epoch, entry)
        if self.best is not None and self.best.epoch is not None:
            restore = {P.RESTORE_BEST: self.best.epoch}
            self.loop.send_to_all(grid, self.nodes, restore, timeout)
            self.best.restore(self.party)
            log(INFO, "restored epoch %d (lowest validation loss)", self.best.epoch + 1)
        if self.loop.averaged:
            metrics = self.loop.restore_average(grid, self.nodes, timeout)
            self.averaged = {"epochs": self.loop.averaged, **dict(metrics or {})}
            log(
                INFO,
                "restored the average of the last %d epochs' weights: %s",
                self.loop.averaged,
                ", ".join(
                    f"{k} {v:.4f}" for k, v in metrics.items() if k.startswith("test_")
                )
                if metrics
                else "no test split",
            )
        result.arrays = ArrayRecord(self.party.top.state_dict())
        return result

    # ----------------------------------------------------- release, checkpoint
    def check_release(self, release: Release) -> None:
        """Refuse to train otherwise than ``release`` says (before any step).

        Raises
        ------
        PrivacyError
            Naming what differs
            (:func:`~tpsl_flwr.strategies.release_check.check_release`).
        """
        check_release(
            release,
            party=self.party,
            privacy=self.privacy,
            epochs=self.epochs,
            held_out=self.validation.fraction,
        )

    def restore_release(self, release: Release) -> None:
        """Check the strategy against its release; continue from its saved state.

        Raises
        ------
        PrivacyError
            As :meth:`check_release`; nothing is sent then.
        """
        self.check_release(release)
        if release.party_state is not None:
            check_resumed_settings(release.party_state, self.settings)
            self.party.load_state_dict(release.party_state)
            self.start_epoch = release.start_epoch
            self.history = list(release.history)
            if self.best is not None and "best" in release.party_state:
                self.best.load_state_dict(release.party_state["best"])
            self._stopped_average = stopped_average(release.party_state)
            self._from_checkpoint = True
            self.check_resumed_average()
            self.loop.check_resumed_batch(release.party_state.get("batch_size"))
            self.loop.load_average_state(release.party_state.get("average"))
            note = f"resuming after epoch {release.start_epoch} of {self.epochs}"
        elif release.resumed:
            self.party.mark_resumed()
            note = "resuming from epoch 1: the run stopped before its first checkpoint"
        if release.resumed and not release.dry_run:  # a dry run only decides
            log(INFO, "%s (key %s)", note, self.party.key.fingerprint)

    def save_checkpoint(self, epoch: int) -> None:
        """With a store: save the label party's state (and best epoch) and history."""
        if self.store is not None:
            state = self.party.state_dict()
            if self.best is not None:
                state["best"] = self.best.state_dict()
            average = self.loop.average_state()
            if average is not None:
                state["average"] = average
            state["average_from"] = self.average_from  # a resume must keep it
            state["batch_size"] = self.batch_size  # and the steps it counted
            state[SETTINGS_KEY] = self.settings  # and the optimizers' settings
            self.store.save_checkpoint(epoch, self.history, state)

    def check_resumed_average(self) -> None:
        """Refuse to resume under another resolved ``average`` than the checkpoint's.

        Raises
        ------
        ConfigError
            Naming both settings (``check_resumed_average`` of
            :mod:`~tpsl_flwr.parties.weight_average`).
        """
        if self._from_checkpoint:
            check_resumed_average(
                self._stopped_average,
                self.average_from,
                average=self.average,
                epochs=self.epochs,
            )
