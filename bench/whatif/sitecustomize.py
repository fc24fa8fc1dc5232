"""What-if for bench/deployment_kd.py: Flower's SuperNode reply wait shortened.

A ``flower-supernode`` that hands a task to its executor waits for the reply
in ``_push_messages`` (``flwr/supernode/start_client_internal.py``, Flower
1.42) by polling its own state with ``time.sleep(0.5)``, and so does the
object push after it. With ``TPSL_WHATIF_SUPERNODE_POLL=S`` in the
environment and this folder first on ``PYTHONPATH``, a ``flower-supernode``
process sleeps ``S`` seconds instead of every 0.5 (its 3 s idle wait between
two receives is kept). Only the bench's what-if rows use it
(``--supernode-wait S``): it measures what Flower's own wait costs a message,
not a way to run the project.
"""

import os
import sys

_WAIT = os.environ.get("TPSL_WHATIF_SUPERNODE_POLL")
if _WAIT and os.path.basename(sys.argv[0] if sys.argv else "") == "flower-supernode":
    import time as _time
    import types

    import flwr.supernode.start_client_internal as _supernode

    _real_sleep = _time.sleep
    _shim = types.ModuleType("time")
    _shim.__dict__.update(_time.__dict__)

    def _sleep(seconds: float) -> None:
        _real_sleep(float(_WAIT) if seconds == 0.5 else seconds)

    _shim.sleep = _sleep  # type: ignore[attr-defined]
    _supernode.time = _shim  # type: ignore[attr-defined]
    print(f"what-if: SuperNode reply wait {_WAIT} s (not 0.5)", file=sys.stderr)
