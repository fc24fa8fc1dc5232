"""Flower strategies that run GradPerturb at the label party."""

from tpsl_flwr.strategies.epoch_log import TPSLResult
from tpsl_flwr.strategies.tpsl_strategy import TPSLStrategy

__all__ = ["TPSLResult", "TPSLStrategy"]
