"""Engines that run the TPSL apps: in-process, Flower's Ray simulation, deployment.

In process (tests, sweeps, the reference for overheads):

* :mod:`~tpsl_flwr.engines.inprocess`: a Flower ``Grid`` that calls the
  ClientApp in this process;
* :mod:`~tpsl_flwr.engines.virtual_nodes`: its virtual SuperNodes (random ids,
  persistent contexts, the ClientApp call, error replies);
* :mod:`~tpsl_flwr.engines.message_copy`: copies of messages and contexts that
  keep the parties apart as a real transport would;
* :mod:`~tpsl_flwr.engines.inprocess_run`: a ServerApp and a ClientApp run in
  one call.

Real Flower processes, launched through Flower's CLI and ended by PID:

* :mod:`~tpsl_flwr.engines.flower_env`: offline environment, the ``flwr``
  executable, free ports, ``key=value`` options and the run-config TOML;
* :mod:`~tpsl_flwr.engines.processes`: the launch marker, ``/proc`` walking,
  termination by PID, :class:`~tpsl_flwr.engines.processes.FlowerLaunchError`;
* :mod:`~tpsl_flwr.engines.flwr_cli`: one ``flwr run --stream`` and its status
  from ``flwr ls``, as a :class:`~tpsl_flwr.engines.flwr_cli.CompletedRun`;
* :mod:`~tpsl_flwr.engines.simulation`: ``flwr run`` on a local SuperLink
  (Ray simulation engine);
* :mod:`~tpsl_flwr.engines.deployment.runtime`: a ``flower-superlink`` plus one
  ``flower-supernode`` per party on loopback, optionally over TLS with
  registered SuperNodes (:mod:`~tpsl_flwr.engines.deployment.security`,
  :mod:`~tpsl_flwr.engines.deployment.certificates`), with a warm executor
  beside each SuperNode (:mod:`~tpsl_flwr.engines.executor.warm`) unless
  told to let Flower run a process per message;
* :mod:`~tpsl_flwr.engines.superlink_guard`: both launchers' SuperLink, which
  answers only the label party's OS user (a peer-uid check of each request);
* :mod:`~tpsl_flwr.engines.launch`: the public launcher names of the modules
  above, re-exported;
* :mod:`~tpsl_flwr.experiments.ray_run`: the TPSL app on Ray, results read back.
"""
