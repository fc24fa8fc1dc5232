"""Launch Flower runs as subprocesses and end every process they start.

The public launcher names, re-exported from the modules that hold them:

- :func:`run_flwr_simulation` (:mod:`~tpsl_flwr.engines.simulation`):
  ``flwr run <app> local --stream``, Ray simulation behind a managed local
  SuperLink;
- :class:`DeploymentRuntime` (:mod:`~tpsl_flwr.engines.deployment.runtime`): a
  ``flower-superlink`` plus one ``flower-supernode`` per party on loopback,
  then ``flwr run <app> <connection>``;
- :class:`CompletedRun` (:mod:`~tpsl_flwr.engines.flwr_cli`): the outcome of
  one ``flwr run``;
- :class:`FlowerLaunchError`, :func:`find_launched_processes`,
  :func:`terminate_launched` and :data:`LAUNCH_ID_ENV`
  (:mod:`~tpsl_flwr.engines.processes`): the launch marker every started
  process carries, and ending them all by PID;
- :func:`offline_flower_env` (:mod:`~tpsl_flwr.engines.flower_env`): the
  environment that runs Flower offline and quietly.
"""

from __future__ import annotations

from tpsl_flwr.engines.deployment.runtime import DeploymentRuntime
from tpsl_flwr.engines.flower_env import offline_flower_env
from tpsl_flwr.engines.flwr_cli import CompletedRun
from tpsl_flwr.engines.processes import (
    LAUNCH_ID_ENV,
    FlowerLaunchError,
    find_launched_processes,
    terminate_launched,
)
from tpsl_flwr.engines.simulation import run_flwr_simulation

__all__ = [
    "LAUNCH_ID_ENV",
    "CompletedRun",
    "DeploymentRuntime",
    "FlowerLaunchError",
    "find_launched_processes",
    "offline_flower_env",
    "run_flwr_simulation",
    "terminate_launched",
]
