"""Validation: the held-out split of the training ids, and the best epoch.

The label party can hold out a fraction of its training ids (a hash of the id
alone decides), score every epoch on their noisy labels and keep the best
epoch's models. Flower-free, so the strategy and the experiments use the same
rules:

* :mod:`~tpsl_flwr.validation.holdout`: when a run holds out ids
  (``validation-fraction = "auto"``) and which ones;
* :mod:`~tpsl_flwr.validation.best_epoch`: the per-epoch noisy-label score and
  the paired rule that keeps an epoch;
* :mod:`~tpsl_flwr.validation.noise_margin`: the standard error the label noise
  adds to a paired difference of scores (the rule's margin).
"""
