"""Criteo and Avazu files: formats, streaming reader, hashing, cache, loaders.

:func:`~tpsl_flwr.data.ctr.criteo.load_criteo` and
:func:`~tpsl_flwr.data.ctr.avazu.load_avazu` read a user's file (pyarrow,
imported on first use); :mod:`~tpsl_flwr.data.ctr.views` reads one party's
columns, or the labels only.
"""
