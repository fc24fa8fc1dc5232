"""The label party's evaluation query, in chunks of bounded size.

Once per epoch the label party asks every node for the embeddings of the
validation ids and the test ids and computes, by itself, the test metrics and
the validation score (nothing derived from labels leaves it). Asking for all of
them in one message held ``n_val + n_test`` rows of cut-layer embeddings, plus
their decoded copies, at once (issue 22: memory must not grow with the rows).
:meth:`EvaluationQuery.run` instead sends the ids in messages of at most
:data:`EVAL_CHUNK_ROWS` rows, one after another, and an
:class:`EvaluationAccumulator` keeps only what the metrics need: the test
probabilities ``(n_test, k)`` and the validation per-class losses
``(n_val, k)``.

The protocol is the single query's, split: the first message carries the
pending perturbed gradients (the nodes apply them before embedding), the last
one the checkpoint setting (the nodes checkpoint after every gradient is
applied), and every message embeds with the same bottom parameters. The ids
are public (``0..n_test-1`` and the hash-chosen validation ids). The top model
runs on the same blocks of :data:`~tpsl_flwr.parties.label_party.PREDICT_CHUNK_ROWS`
rows whatever the chunk size, so the metrics are bitwise those of one message.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import Message, MetricRecord
from flwr.serverapp import Grid

from tpsl_flwr._util.allocator import trim_heap
from tpsl_flwr.metrics.evaluation import classification_metrics
from tpsl_flwr.parties import LabelParty
from tpsl_flwr.parties.label_party import PREDICT_CHUNK_ROWS
from tpsl_flwr.strategies.exchange import exchange
from tpsl_flwr.strategies.step_state import StepState, scale_setting
from tpsl_flwr.validation.holdout import Validation
from tpsl_flwr.validation.scores import validation_class_losses
from tpsl_flwr.wire import protocol as P
from tpsl_flwr.wire.label_side import (
    Node,
    check_echo,
    check_replies,
    gather_embeddings,
    step_message,
)

__all__ = [
    "EVAL_CHUNK_ROWS",
    "EvaluationAccumulator",
    "EvaluationQuery",
    "query_chunks",
    "release_chunk",
]

EVAL_CHUNK_ROWS = 1 << 16
"""Most ids one evaluation query message asks each node to embed."""

Chunk = tuple[list[np.ndarray], list[str]]


def query_chunks(ids: list[np.ndarray], splits: list[str], rows: int) -> list[Chunk]:
    """Pack the query's batches of ids, in order, into chunks of ``<= rows`` ids.

    A chunk is ``(batches, splits)``. Each batch is cut at multiples of
    ``rows`` from its own start, and whole pieces are packed greedily, so when
    everything fits there is one chunk, the single query's batches; and every
    piece starts where the nodes' own blocks of embedding rows would (for
    ``rows`` a multiple of :data:`~tpsl_flwr.parties.non_label_party.EMBED_CHUNK_ROWS`),
    so each node computes the same embeddings as for one message. Always at
    least one chunk (empty when there is nothing to embed): the query's first
    message flushes the pending gradients even then.

    Examples
    --------
    >>> chunks = query_chunks([np.arange(3), np.arange(4)], ["train", "test"], 5)
    >>> [([b.tolist() for b in batches], s) for batches, s in chunks]
    [([[0, 1, 2]], ['train']), ([[0, 1, 2, 3]], ['test'])]
    """
    chunks: list[Chunk] = [([], [])]
    room = rows
    for batch, split in zip(ids, splits, strict=True):
        for start in range(0, batch.size, rows):
            piece = batch[start : start + rows]
            if piece.size > room:
                chunks.append(([], []))
                room = rows
            chunks[-1][0].append(piece)
            chunks[-1][1].append(split)
            room -= piece.size
    return chunks


class EvaluationAccumulator:
    """The test probabilities and validation losses of one evaluation, by chunks.

    Embeddings of a split are fed in order (:meth:`add`); the top model runs on
    blocks of exactly :data:`PREDICT_CHUNK_ROWS` rows of the split (the last
    one shorter), the blocks ``LabelParty.predict`` and
    :func:`~tpsl_flwr.validation.scores.validation_class_losses` use on a
    whole split, so the results do not depend on how the rows were chunked.
    At most ``PREDICT_CHUNK_ROWS`` + one chunk of embeddings is held.

    Parameters
    ----------
    party
        The label party (its top model predicts).
    test_labels
        The test labels; ``None``: no test metrics.
    validation
        The run's held-out ids, which score the ``train`` split; ``None``: none.
    """

    def __init__(
        self,
        party: LabelParty,
        test_labels: np.ndarray | None,
        validation: Validation | None = None,
    ) -> None:
        self.party = party
        self.test_labels = test_labels
        self.validation = validation
        self._waiting: dict[str, list[torch.Tensor]] = {"train": [], "test": []}
        self._outputs: dict[str, list[np.ndarray]] = {"train": [], "test": []}

    def add(self, split: str, embeddings: torch.Tensor) -> None:
        """Take the next embeddings of ``split`` (``train``: validation ids)."""
        waiting = self._waiting[split]
        waiting.append(embeddings)
        rows = sum(len(e) for e in waiting)
        if rows < PREDICT_CHUNK_ROWS:
            return
        whole = torch.cat(waiting) if len(waiting) > 1 else waiting[0]
        full = rows - rows % PREDICT_CHUNK_ROWS
        for start in range(0, full, PREDICT_CHUNK_ROWS):
            self._run(split, whole[start : start + PREDICT_CHUNK_ROWS])
        waiting.clear()
        if full < rows:
            waiting.append(whole[full:].clone())

    def _run(self, split: str, block: torch.Tensor) -> None:
        if split == "test":
            self._outputs[split].append(self.party.predict(block))
        else:
            self._outputs[split].append(validation_class_losses(self.party, block))

    def _finish(self, split: str) -> np.ndarray | None:
        if self._waiting[split]:
            waiting = self._waiting[split]
            self._run(split, torch.cat(waiting) if len(waiting) > 1 else waiting[0])
            waiting.clear()
        outputs, self._outputs[split] = self._outputs[split], []
        if not outputs:
            return None
        # The blocks go as they are joined: one copy of the split is kept.
        return outputs[0] if len(outputs) == 1 else np.concatenate(outputs)

    def result(self) -> MetricRecord | None:
        """Test metrics and ``validation_loss`` (its per-id losses kept pending)."""
        metrics: dict[str, Any] = {}
        probs = self._finish("test")
        if self.test_labels is not None and probs is not None:
            metrics.update(classification_metrics(self.test_labels, probs))
        del probs
        class_losses = self._finish("train")
        if class_losses is not None and self.validation is not None:
            score = self.validation.score_class_losses(self.party, class_losses)
            metrics["validation_loss"] = score
        return MetricRecord(metrics) if metrics else None


class EvaluationQuery:
    """The label party's evaluation query: its messages, replies and metrics.

    Parameters
    ----------
    party
        The label party.
    validation
        The run's held-out ids (possibly none).
    test_labels
        Labels of the test ids ``0..n_test-1``; ``None``: no test split.
    wire_dtype, lr_schedule, poll_interval
        The strategy's (:class:`~tpsl_flwr.strategies.TPSLStrategy`).
    """

    def __init__(
        self,
        party: LabelParty,
        validation: Validation,
        test_labels: np.ndarray | None,
        *,
        wire_dtype: str,
        lr_schedule: str,
        poll_interval: float,
    ) -> None:
        self.party = party
        self.validation = validation
        self.test_labels = test_labels
        self.wire_dtype = wire_dtype
        self.lr_schedule = lr_schedule
        self.poll_interval = poll_interval

    @property
    def num_test(self) -> int:
        """Test ids the nodes embed (``0..num_test-1``)."""
        return 0 if self.test_labels is None else int(self.test_labels.size)

    def ids(self) -> tuple[list[np.ndarray], list[str]]:
        """The ids the query embeds (validation, then test), and their splits."""
        return self.validation.query(self.num_test)

    def accumulator(self) -> EvaluationAccumulator:
        """A fresh accumulator of this query's metrics."""
        return EvaluationAccumulator(self.party, self.test_labels, self.validation)

    def messages(
        self,
        state: StepState,
        nodes: list[Node],
        server_round: int,
        config: dict[str, Any],
        ids: list[np.ndarray],
        splits: list[str],
    ) -> list[Message]:
        """One query per node for ``ids``; it carries the pending gradients."""
        settings = {P.EPOCH: state.epoch, P.ROUND: server_round, P.SPLIT: "test"}
        settings.update(config)
        settings.update(scale_setting(state, self.lr_schedule))
        if self.validation.active:
            settings[P.SPLITS] = ",".join(splits)
        return [
            step_message(
                n, P.MSG_EMBED_TEST, settings, ids, state.pending, self.wire_dtype
            )
            for n in nodes
        ]

    def absorb(
        self,
        state: StepState,
        accumulator: EvaluationAccumulator,
        nodes: list[Node],
        replies: Iterable[Message],
        ids: list[np.ndarray],
        splits: list[str],
    ) -> dict[int, Message]:
        """Check one query's replies and feed their embeddings to ``accumulator``.

        The query carried the pending gradients, if any: they are dispatched.
        Returns the replies by node.
        """
        by_node = check_replies(nodes, replies, [n.node_id for n in nodes])
        state.pending = []
        embeddings = gather_embeddings(nodes, by_node, ids)
        for split, emb in zip(splits, embeddings, strict=True):
            accumulator.add(split, emb)
        return by_node

    def run(
        self,
        state: StepState,
        grid: Grid,
        nodes: list[Node],
        server_round: int,
        last_settings: dict[str, Any],
        timeout: float,
        echo: Mapping[str, int] | None = None,
    ) -> MetricRecord | None:
        """The epoch's evaluation query, in chunks of ``<= EVAL_CHUNK_ROWS`` ids.

        ``last_settings`` (the checkpoint epoch) go with the last message only;
        ``echo``: what every reply to it must confirm
        (:func:`~tpsl_flwr.wire.label_side.check_echo`), before any metric.
        Each chunk's messages and replies are released once absorbed, so at most
        one chunk's embeddings (and the accumulator's waiting rows) are alive.
        """
        ids, splits = self.ids()
        chunks = query_chunks(ids, splits, EVAL_CHUNK_ROWS)
        accumulator = self.accumulator()
        for i, (batches, names) in enumerate(chunks):
            config = last_settings if i == len(chunks) - 1 else {}
            messages = self.messages(state, nodes, server_round, config, batches, names)
            replies = exchange(grid, messages, timeout, self.poll_interval)
            del messages  # the chunk's ids and gradients: sent
            by_node = self.absorb(state, accumulator, nodes, replies, batches, names)
            if echo and i == len(chunks) - 1:
                check_echo(nodes, by_node, echo)
            del by_node
            # The chunk's embeddings go before the next chunk's arrive, not after
            # (after the last one nothing arrives: a one-chunk query skips the
            # ~0.2 s).
            del replies
            if i < len(chunks) - 1:
                release_chunk()
        return accumulator.result()


def release_chunk() -> None:
    """Free what one chunk's round trip left behind, before the next one.

    What a round trip replaced waits for the cyclic collector: traced at 2M
    Criteo rows on the in-process engine (where each node re-encodes its
    state, ~40 MB for a DLRM node, with every reply), the live memory climbed
    by one chunk's worth, ~134 MB, for up to three chunks in a row, and glibc
    kept the freed blocks resident, so the resident set rose chunk after
    chunk, ~300 MB above the training level (``bench/README.md``, "Memory per
    row"). A full collection (~0.2 s with the label party's objects) and
    ``malloc_trim`` (~3 ms) per chunk of up to 65,536 rows cost ~1% of an
    epoch and change no value.
    """
    gc.collect()
    trim_heap()
