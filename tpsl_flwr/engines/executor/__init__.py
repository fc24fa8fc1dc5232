"""A warm ClientApp executor beside a SuperNode started with ``--isolation process``.

* :mod:`~tpsl_flwr.engines.executor.warm`: the executor (``tpsl-flwr
  executor``): Flower's task protocol per token, in one long-lived process
  that keeps the loaded ClientApp;
* :mod:`~tpsl_flwr.engines.executor.fab_match`: which app bundles may run
  warm (allow-listed, and their code the code imported here);
* :mod:`~tpsl_flwr.engines.executor.flower_seam`: the Flower internals it is
  built on, imported in one place and pinned by a test.
"""
