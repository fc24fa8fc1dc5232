"""A node's ClientApp survives the pickling Flower's Ray backend gives it."""

from __future__ import annotations

import threading

import pytest
from flwr.clientapp import ClientApp

from tpsl_flwr.wire.node_side import NonLabelHandlers, make_client_app

cloudpickle = pytest.importorskip("ray.cloudpickle")


def _factory(context):  # never called here
    raise AssertionError("no party is built by pickling")


def test_a_node_client_app_pickles_as_flowers_ray_backend_ships_it():
    # Prepare: a ClientApp whose handlers hold their lock and a cached party
    handlers = NonLabelHandlers(_factory)
    handlers._cache[7] = {1: (3, object())}
    app = make_client_app(_factory)

    # Execute: what Ray does to the ClientApp it runs in its actors
    clone = cloudpickle.loads(cloudpickle.dumps(app))
    copied = cloudpickle.loads(cloudpickle.dumps(handlers))

    # Assert: a working copy with a fresh lock and no party carried along
    assert isinstance(clone, ClientApp)
    assert isinstance(copied._lock, type(threading.Lock()))
    assert copied._lock is not handlers._lock
    assert not copied._cache and handlers._cache
