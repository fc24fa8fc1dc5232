"""Sweeps: a grid of experiments from a TOML file, resumable, and its report.

* :mod:`~tpsl_flwr.experiments.sweep.config`: the grid, its runs, their names
  and noise seeds; :mod:`~tpsl_flwr.experiments.sweep.axes`: its optional axes;
* :mod:`~tpsl_flwr.experiments.sweep.run`: every unfinished run, then the CSV,
  tables and plots;
* :mod:`~tpsl_flwr.experiments.sweep.report`,
  :mod:`~tpsl_flwr.experiments.sweep.stats`,
  :mod:`~tpsl_flwr.experiments.sweep.pairs`,
  :mod:`~tpsl_flwr.experiments.sweep.scale`: the tables and plots, shaped like
  the TPSL paper's.
"""
