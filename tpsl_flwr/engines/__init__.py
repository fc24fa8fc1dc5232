"""Engines that run the TPSL apps: in-process, Flower's Ray simulation, deployment.

* :mod:`~tpsl_flwr.engines.inprocess`: a Flower ``Grid`` that calls the
  ClientApp in this process (tests, sweeps, the reference for overheads), with
  :mod:`~tpsl_flwr.engines.message_copy` keeping messages apart as a real
  transport would.
* :mod:`~tpsl_flwr.engines.launch`: ``flwr run`` of an app on a local
  SuperLink, and a local deployment runtime (``flower-superlink`` plus one
  ``flower-supernode`` per party), every process ended by PID.
* :mod:`~tpsl_flwr.engines.flower_run`: the TPSL app on Ray, results read back.
"""
