"""party-actors = true: on Ray, each node's party lives in one Ray actor."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from tpsl_flwr.engines.flower_env import offline_flower_env
from tpsl_flwr.engines.virtual_nodes import task_identity
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.run import run_experiment
from tpsl_flwr.simulations.client_app import app as forwarding_app
from tpsl_flwr.simulations.node_app import app as node_app
from tpsl_flwr.wire import protocol as P
from tpsl_flwr.wire.arrays import from_array, to_array
from tpsl_flwr.wire.batch_pack import stack_rows

# Runs in its own interpreter (Ray stays out of the test process): the node of
# partition 1 answers a hello and two steps through its party actor, then the
# actor is killed, and a ClientApp process that never met it asks again.
_SCRIPT = r"""
import json, sys, time
import numpy as np, ray
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from tpsl_flwr.engines.virtual_nodes import task_identity
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.simulations import party_actor
from tpsl_flwr.simulations.client_app import app
from tpsl_flwr.wire import protocol as P
from tpsl_flwr.wire.arrays import from_array, to_array
from tpsl_flwr.wire.batch_pack import stack_rows

def message(content, kind):
    with task_identity(3, 11, 1):
        msg = Message(content, dst_node_id=11, message_type=kind)
    msg.metadata.__dict__["_message_id"] = f"m-{kind}-{id(msg)}"
    return msg

def attempt(content, kind, context):
    try:
        app(message(content, kind), context)
        return "answered"
    except Exception as err:
        return f"{type(err).__name__}: {err}"

ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
try:
    run_config = ExperimentConfig(
        dataset="breast-cancer", batch_size=32, party_actors=True
    ).to_run_config()
    context = Context(3, 11, {P.PARTITION_ID: 1, P.NUM_PARTITIONS: 2},
                      RecordDict(), run_config)
    ids, rows = stack_rows([np.arange(8, dtype=np.int64)])
    step = RecordDict({P.CONFIG: ConfigRecord({P.BATCH_ROWS: rows}),
                       P.NEW_IDS: ArrayRecord({P.IDS_KEY: to_array(ids)})})
    replies = [app(message(c, k), context) for c, k in (
        (RecordDict({P.CONFIG: ConfigRecord({})}), "query.hello"),
        (step, "train"), (step, "train"))]
    name = party_actor.actor_name(3, 1, 2)
    out = {
        "node": dict(replies[0].content[P.NODE]),
        "embeddings": [
            from_array(r.content[P.EMBEDDINGS][P.EMBEDDINGS_KEY]).tolist()
            for r in replies[1:]
        ],
        "state": {k: dict(v) for k, v in context.state.config_records.items()},
        "arrays_in_state": len(context.state.array_records),
        "actor_found": ray.get_actor(name) is not None,
    }
    other = Context(3, 12, {P.PARTITION_ID: 0, P.NUM_PARTITIONS: 2},
                    RecordDict(), run_config)
    app(message(RecordDict({P.CONFIG: ConfigRecord({})}), "query.hello"), other)
    out["actors"] = sorted(
        n for n in ray.util.list_named_actors() if n.startswith("tpsl-party-3-")
    )
    ray.kill(ray.get_actor(name))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the name is free once the actor is dead
        try:
            ray.get_actor(name)
            time.sleep(0.2)
        except ValueError:
            break
    out["after_kill"] = attempt(step, "train", context)  # this process's handle
    party_actor._HANDLES.clear()  # another ClientApp process: no handle yet
    out["fresh_actor"] = attempt(step, "train", context)
finally:
    ray.shutdown()
print("RESULT " + json.dumps(out))
"""


def _message(content: RecordDict, kind: str) -> Message:
    with task_identity(3, 11, 1):
        msg = Message(content, dst_node_id=11, message_type=kind)
    msg.metadata.__dict__["_message_id"] = f"m-{kind}-{id(msg)}"
    return msg


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_party_actor_answers_as_the_node_app_and_refuses_a_fresh_model(
    tmp_path: Path,
) -> None:
    # Arrange: the same node in this process, as every engine runs it
    run_config = ExperimentConfig(
        dataset="breast-cancer", batch_size=32
    ).to_run_config()
    local = Context(
        3, 11, {P.PARTITION_ID: 1, P.NUM_PARTITIONS: 2}, RecordDict(), run_config
    )
    ids, rows = stack_rows([np.arange(8, dtype=np.int64)])
    step = RecordDict(
        {
            P.CONFIG: ConfigRecord({P.BATCH_ROWS: rows}),
            P.NEW_IDS: ArrayRecord({P.IDS_KEY: to_array(ids)}),
        }
    )
    hello = node_app(
        _message(RecordDict({P.CONFIG: ConfigRecord({})}), "query.hello"), local
    )
    expected = [
        from_array(
            node_app(_message(step, "train"), local).content[P.EMBEDDINGS][
                P.EMBEDDINGS_KEY
            ]
        )
        for _ in range(2)
    ]

    # Act: through a party actor on a real Ray instance
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env=offline_flower_env(tmp_path / "flwr-home"),
    )

    # Assert: the same answers; only the actor's count in the node's context
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT ") :])
    assert out["node"] == dict(hello.content[P.NODE])
    for got, want in zip(out["embeddings"], expected, strict=True):
        np.testing.assert_array_equal(np.asarray(got, dtype=want.dtype), want)
    assert out["actor_found"]
    assert out["actors"] == ["tpsl-party-3-0-of-2", "tpsl-party-3-1-of-2"]
    assert out["state"] == {"tpsl.party-actor": {"version": 2}}
    assert out["arrays_in_state"] == 0
    # its actor gone: an error, then a refusal, never a fresh model
    assert (
        out["after_kill"].startswith("PartyActorError")
        and "is gone" in out["after_kill"]
    )
    assert "did not train this node" in out["fresh_actor"]


def test_party_actors_outside_ray_are_refused(tmp_path: Path) -> None:
    # Arrange
    run_config = ExperimentConfig(
        dataset="breast-cancer", party_actors=True
    ).to_run_config()
    context = Context(
        3, 11, {P.PARTITION_ID: 0, P.NUM_PARTITIONS: 2}, RecordDict(), run_config
    )
    cfg = ExperimentConfig(
        dataset="breast-cancer", party_actors=True, out_dir=str(tmp_path / "out")
    )

    # Act / Assert: a ClientApp outside Ray, and the local engine, refuse
    hello = _message(RecordDict({P.CONFIG: ConfigRecord({})}), "query.hello")
    with pytest.raises(ConfigError, match="needs Flower's Ray simulation"):
        forwarding_app(hello, context)
    with pytest.raises(ConfigError, match="for the ray engine, got engine 'local'"):
        run_experiment(cfg, engine="local")
    assert not (tmp_path / "out").exists()
