"""Local deployment: a ``flower-superlink`` and one ``flower-supernode`` per party.

* :mod:`~tpsl_flwr.engines.deployment.runtime`: the processes on loopback
  (:class:`~tpsl_flwr.engines.deployment.runtime.DeploymentRuntime`);
* :mod:`~tpsl_flwr.engines.deployment.security`: TLS and SuperNode
  authentication, and the ``flwr`` CLI's connection;
* :mod:`~tpsl_flwr.engines.deployment.certificates`: local TLS certificates and
  SuperNode key pairs;
* :mod:`~tpsl_flwr.engines.deployment.fleet_proxy`: an nginx proxy that exposes
  only the SuperLink's Fleet API;
* :mod:`~tpsl_flwr.engines.deployment.faults`: crash and restart its processes,
  for fault tests.
"""
