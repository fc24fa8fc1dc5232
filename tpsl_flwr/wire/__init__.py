"""The wire: the one place that speaks Flower's Message API.

Both halves of every TPSL message live here, side by side: what the label
party sends and reads (:mod:`~tpsl_flwr.wire.label_side`) and what a non-label
node reads and answers (:mod:`~tpsl_flwr.wire.node_side`, whose
:func:`~tpsl_flwr.wire.node_side.make_client_app` serves any
``NonLabelParty``), the message keys and their allow-list
(:mod:`~tpsl_flwr.wire.protocol`), the array encoding
(:mod:`~tpsl_flwr.wire.arrays`), the node-state codec
(:mod:`~tpsl_flwr.wire.state_codec`) and the attacker-side recorder mod
(:mod:`~tpsl_flwr.wire.recorder`).
"""
