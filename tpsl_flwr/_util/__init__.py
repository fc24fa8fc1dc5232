"""Small helpers every layer may use: checks, compact ints, owner-only files.

Argument checks (:mod:`~tpsl_flwr._util.checks`), the finite check of a tensor
(:mod:`~tpsl_flwr._util.finite`), per-row integer arrays in the narrowest dtype
(:mod:`~tpsl_flwr._util.compact_ints`), files only their owner may read
(:mod:`~tpsl_flwr._util.private_files`) and the allocator's trim
(:mod:`~tpsl_flwr._util.allocator`).

Private to the package (nothing here is part of the embedding surface): each
module imports only the standard library, numpy, torch and
:mod:`tpsl_flwr.errors`.
"""
