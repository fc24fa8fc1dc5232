"""Metrics: the one ROC AUC of the project, and test metrics at the label party.

:mod:`~tpsl_flwr.metrics.auc` is what attacks and evaluation alike score with;
:mod:`~tpsl_flwr.metrics.evaluation` turns the label party's test predictions
into AUC, accuracy and log loss (labels never leave it). numpy only.
"""
