"""Experiments: the typed run config, one run of the label party, sweeps, reports.

:mod:`~tpsl_flwr.experiments.config` parses the Flower run config once into an
:class:`~tpsl_flwr.experiments.config.ExperimentConfig`;
:mod:`~tpsl_flwr.experiments.experiment` builds and runs the label party and
writes the results JSON; :mod:`~tpsl_flwr.experiments.run` runs one experiment
on either engine (:func:`~tpsl_flwr.experiments.run.run_experiment`);
:mod:`~tpsl_flwr.experiments.sweep.config` describes grids of experiments and
:mod:`~tpsl_flwr.experiments.sweep.run` runs them and writes the paper's tables and
figures.
"""
