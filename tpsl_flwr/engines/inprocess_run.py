"""Run a ServerApp and a ClientApp in this process, in one call.

:func:`run_inprocess` builds an :class:`~tpsl_flwr.engines.inprocess.InProcessGrid`
of ``num_nodes`` virtual nodes and runs the ServerApp's main function against
it: the quickest way to run one ServerApp/ClientApp pair in a test or a sweep.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flwr.app import UserConfigValue
from flwr.serverapp import ServerApp

from tpsl_flwr.engines.inprocess import InProcessGrid, ServerMain
from tpsl_flwr.engines.virtual_nodes import ClientAppCallable

__all__ = ["run_inprocess"]


def run_inprocess(
    server_main: ServerApp | ServerMain,
    client_app: ClientAppCallable,
    num_nodes: int,
    run_config: Mapping[str, UserConfigValue] | None = None,
    node_configs: Sequence[Mapping[str, UserConfigValue]] | None = None,
    **grid_options: Any,
) -> Any:
    """Run a ServerApp and a ClientApp in this process with ``num_nodes`` nodes.

    Parameters
    ----------
    server_main : ServerApp | ServerMain
        ``ServerApp`` with a registered ``@app.main()``, or the plain function.
    client_app : ClientAppCallable
        The ``ClientApp``.
    num_nodes : int
        Number of virtual nodes.
    run_config : Mapping[str, UserConfigValue] | None
        The run config (kebab-case keys, as in ``[tool.flwr.app.config]``).
    node_configs : Sequence[Mapping[str, UserConfigValue]] | None
        Extra per-node config, merged over ``partition-id``/``num-partitions``.
    **grid_options : Any
        Keyword options of :class:`InProcessGrid` (``seed``, ``on_message``,
        ``record_messages``, ...).

    Returns
    -------
    Any
        Whatever the main function returns.

    Examples
    --------
    >>> from flwr.app import ConfigRecord, Message, RecordDict
    >>> def echo(msg, context):
    ...     pid = context.node_config["partition-id"]
    ...     return Message(RecordDict({"r": ConfigRecord({"p": pid})}), reply_to=msg)
    >>> def main(grid, context):
    ...     msgs = [
    ...         Message(RecordDict(), dst_node_id=n, message_type="query")
    ...         for n in grid.get_node_ids()
    ...     ]
    ...     return sorted(r.content["r"]["p"] for r in grid.send_and_receive(msgs))
    >>> run_inprocess(main, echo, num_nodes=3)
    [0, 1, 2]
    """
    grid = InProcessGrid(
        client_app,
        num_nodes,
        run_config=run_config,
        node_configs=node_configs,
        **grid_options,
    )
    return grid.run_server(server_main)
