"""Testing support: synthetic Criteo and Avazu files for tests and benchmarks.

No real rows are shipped: :func:`write_criteo` and :func:`write_avazu` write
files in the real formats (heavy-tailed counts, Zipf-like categoricals,
missing values) from a seed.
"""

from tpsl_flwr.testing.ctr_generator import GeneratedFile, write_avazu, write_criteo

__all__ = ["GeneratedFile", "write_avazu", "write_criteo"]
