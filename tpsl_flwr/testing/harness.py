"""Run a label-party strategy against ClientApps in this process; see what left it.

:func:`run_strategy` is the unit-test harness for embedders: it runs
:meth:`TPSLStrategy.start <tpsl_flwr.strategies.TPSLStrategy.start>` on an
:class:`~tpsl_flwr.engines.inprocess.InProcessGrid` of ``num_nodes`` virtual
nodes serving your ClientApp, and returns a :class:`StrategyReport`: the
gradient slices each node received (decoded with the wire's own keys,
:mod:`tpsl_flwr.wire.protocol`), the full perturbed cut-layer gradients the
label party computed, the Flower result with its privacy accounting, and every
message sent. No Ray, no SuperLink, no files unless your apps write some.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from flwr.app import Message, UserConfigValue

from tpsl_flwr.engines.inprocess import InProcessGrid
from tpsl_flwr.engines.virtual_nodes import ClientAppCallable
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.privacy.accounting import PrivacySpent
from tpsl_flwr.strategies import TPSLStrategy
from tpsl_flwr.strategies.epoch_log import TPSLResult
from tpsl_flwr.wire import protocol as P
from tpsl_flwr.wire.batch_pack import gradient_batches

__all__ = ["ComputedStep", "DispatchedStep", "StrategyReport", "run_strategy"]


@dataclass(frozen=True)
class DispatchedStep:
    """One gradient slice a node received, decoded from the wire.

    Attributes
    ----------
    epoch
        The epoch of the message that carried it (0-based).
    step
        The step of that epoch the gradient was computed at (0-based), so
        ``report.computed`` of the same ``(epoch, step)`` is its source.
    ids
        ``(n,)`` int64 sample ids of the batch.
    gradient
        ``(n, width)`` float32: this node's columns of the perturbed gradient.
    """

    epoch: int
    step: int
    ids: np.ndarray
    gradient: np.ndarray


@dataclass(frozen=True)
class ComputedStep:
    """One step of the label party: the full perturbed cut-layer gradient.

    Attributes
    ----------
    epoch
        The epoch (0-based).
    step
        The step within the epoch (0-based).
    ids
        ``(n,)`` int64 sample ids of the batch.
    gradient
        ``(n, total width)`` float32, as ``party.train_step`` returned it.
    embeddings
        ``(n, total width)`` float32 concatenated embeddings it was computed
        from (to recompute a gradient from the top model).
    """

    epoch: int
    step: int
    ids: np.ndarray
    gradient: np.ndarray
    embeddings: np.ndarray


@dataclass
class StrategyReport:
    """What :func:`run_strategy` saw.

    Attributes
    ----------
    dispatched
        ``partition -> [DispatchedStep, ...]``: the gradient slices each node
        received, in the order it received them.
    computed
        Every step's :class:`ComputedStep`, in order.
    result
        What ``strategy.start`` returned.
    history
        ``strategy.history``: one entry per epoch.
    messages
        Every message the label party sent (copies, as the nodes got them).
    replies
        Every reply the nodes sent.
    """

    dispatched: dict[int, list[DispatchedStep]]
    computed: list[ComputedStep]
    result: TPSLResult
    history: list[dict[str, Any]]
    messages: list[Message] = field(default_factory=list)
    replies: list[Message] = field(default_factory=list)

    @property
    def privacy(self) -> PrivacySpent | None:
        """The run's privacy accounting (``result.privacy``)."""
        return self.result.privacy

    @property
    def epsilon_spent(self) -> float | None:
        """The run's pure epsilon per label (``result.epsilon_spent``)."""
        return self.result.epsilon_spent


def run_strategy(
    strategy: TPSLStrategy,
    client_app: ClientAppCallable,
    num_nodes: int = 2,
    *,
    run_config: Mapping[str, UserConfigValue] | None = None,
    node_configs: Sequence[Mapping[str, UserConfigValue]] | None = None,
    timeout: float = 60.0,
    seed: int | None = None,
) -> StrategyReport:
    """Run ``strategy`` against ``num_nodes`` in-process nodes serving ``client_app``.

    The nodes are an :class:`~tpsl_flwr.engines.inprocess.InProcessGrid`
    (node ``i`` has ``partition-id = i``, ``num-partitions = num_nodes``; a
    handler's exception becomes an error reply, as on Flower). While it runs,
    ``strategy.party.train_step`` is wrapped to record each step's gradient;
    the original is restored afterwards, even on error.

    Parameters
    ----------
    strategy
        The label party, as you would start it in your ServerApp.
    client_app
        Your ClientApp (e.g. :func:`~tpsl_flwr.wire.node_side.make_client_app`)
        or any ``f(message, context) -> Message``.
    num_nodes
        Number of non-label nodes; must equal ``strategy.num_nodes`` if set.
    run_config
        The run config every node's context carries.
    node_configs
        Extra per-node config, one mapping per node.
    timeout
        Seconds the strategy waits for each reply (``strategy.start``).
    seed
        Seed of the node ids and reply order (``None``: fresh, as Flower).

    Returns
    -------
    StrategyReport
        Dispatched slices per partition, computed gradients, the result, the
        history and every message.

    Raises
    ------
    ConfigError
        If ``num_nodes`` disagrees with ``strategy.num_nodes``.
    TPSLError
        Whatever the run raises (a refused node, a fault, a privacy error).

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from tpsl_flwr import NoiseKey, make_mechanism
    >>> from tpsl_flwr.parties import LabelParty, NonLabelParty
    >>> from tpsl_flwr.wire.node_side import make_client_app
    >>> x = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    >>> class Bottom(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.layer = nn.Linear(2, 3)
    ...
    ...     def forward(self, numeric, categorical):
    ...         return self.layer(numeric)
    >>> def node(context):
    ...     cols = slice(2 * context.node_config["partition-id"], None)
    ...     return NonLabelParty({"train": (x[:, cols][:, :2], None)}, Bottom())
    >>> party = LabelParty(nn.Linear(6, 1), (x[:, 0] > 0).astype(int),
    ...                    make_mechanism("laplace", epsilon=1.0),
    ...                    NoiseKey.from_seed(0))
    >>> strategy = TPSLStrategy(party, batch_size=8, epochs=2, num_nodes=2)
    >>> report = run_strategy(strategy, make_client_app(node), num_nodes=2)
    >>> report.epsilon_spent, len(report.computed), len(report.dispatched[1])
    (1.0, 4, 4)
    >>> sent = report.dispatched[1][0]
    >>> step = report.computed[0]
    >>> bool(np.array_equal(sent.gradient, step.gradient[:, 3:6]))
    True
    """
    if strategy.num_nodes is not None and strategy.num_nodes != num_nodes:
        raise ConfigError(
            f"num_nodes must equal the strategy's num_nodes ({strategy.num_nodes}), "
            f"got {num_nodes}"
        )
    grid = InProcessGrid(
        client_app,
        num_nodes,
        run_config=run_config,
        node_configs=node_configs,
        seed=seed,
        record_messages=True,
    )
    computed: list[ComputedStep] = []
    with _recording(strategy, computed):
        result = grid.run_server(
            lambda g, _ctx: strategy.start(grid=g, timeout=timeout)
        )
    return StrategyReport(
        dispatched=_dispatched(grid),
        computed=computed,
        result=result,
        history=strategy.history,
        messages=list(grid.sent_messages),
        replies=list(grid.received_replies),
    )


@contextmanager
def _recording(strategy: TPSLStrategy, into: list[ComputedStep]) -> Iterator[None]:
    """Wrap ``strategy.party.train_step`` to append each step; restore it after."""
    party = strategy.party
    wrapped = party.train_step
    had_own = "train_step" in vars(party)
    steps: dict[int, int] = {}

    def train_step(sample_ids: Any, embeddings: Any, epoch: int = 0) -> Any:
        grad = wrapped(sample_ids, embeddings, epoch=epoch)
        step = steps.get(epoch, 0)
        steps[epoch] = step + 1
        into.append(
            ComputedStep(
                epoch=epoch,
                step=step,
                ids=np.asarray(sample_ids, dtype=np.int64).copy(),
                gradient=_numpy(grad),
                embeddings=_numpy(embeddings),
            )
        )
        return grad

    party.train_step = train_step  # type: ignore[method-assign]
    try:
        yield
    finally:
        if had_own:
            party.train_step = wrapped  # type: ignore[method-assign]
        else:
            del party.train_step


def _numpy(values: Any) -> np.ndarray:
    """A float32 copy of a tensor (or array)."""
    return torch.as_tensor(values).detach().numpy().astype(np.float32, copy=True)


def _dispatched(grid: InProcessGrid) -> dict[int, list[DispatchedStep]]:
    """Decode every gradient slice the nodes received, per partition, in order."""
    out: dict[int, list[DispatchedStep]] = {
        node.partition_id: [] for node in grid.nodes
    }
    counts: dict[tuple[int, int], int] = {}
    for msg in grid.sent_messages:
        if P.GRADS not in msg.content.array_records:
            continue
        config = msg.content.config_records.get(P.CONFIG)
        epoch = 0
        if config is not None and P.EPOCH in config:
            epoch = P.as_int(config[P.EPOCH], "epoch")
        partition = grid.partition_of(msg.metadata.dst_node_id)
        for ids, gradient in gradient_batches(msg.content):
            step = counts.get((partition, epoch), 0)
            counts[(partition, epoch)] = step + 1
            out[partition].append(
                DispatchedStep(epoch=epoch, step=step, ids=ids, gradient=gradient)
            )
    return out
