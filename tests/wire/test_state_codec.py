"""Tests of the exact state codec a non-label node keeps in ``context.state``."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Context, RecordDict

from tpsl_flwr.errors import ProtocolError
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.run import run_inprocess_experiment
from tpsl_flwr.models import BottomModel
from tpsl_flwr.simulations.client_app import builtin_party
from tpsl_flwr.wire import node_side as client_app_module
from tpsl_flwr.wire import protocol as P
from tpsl_flwr.wire.node_side import KEEP_RUNS, STATE_KEY, NonLabelHandlers
from tpsl_flwr.wire.state_codec import UnsupportedStateError, decode_state, encode_state


def _assert_identical(a: object, b: object) -> None:
    """Same structure, same Python types, tensors equal bit for bit."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(
            a.contiguous().reshape(-1).view(torch.uint8),
            b.contiguous().reshape(-1).view(torch.uint8),
        )
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b)
        for key in a:
            _assert_identical(a[key], b[key])
        _assert_identical(getattr(a, "_metadata", None), getattr(b, "_metadata", None))
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_identical(x, y)
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b)
    else:
        assert a == b


def _trained(seed: int, optimizer: str) -> tuple[BottomModel, torch.optim.Optimizer]:
    gen = torch.Generator().manual_seed(seed)
    model = BottomModel(5, [7, 11], hidden=(8,), out_dim=4, generator=gen)
    opt: torch.optim.Optimizer
    if optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    numeric = torch.randn(32, 5, generator=gen)
    categorical = torch.stack(
        [torch.randint(0, 7, (32,), generator=gen), torch.randint(0, 11, (32,))], 1
    )
    for _ in range(3):
        opt.zero_grad()
        model(numeric, categorical).square().sum().backward()
        opt.step()
    return model, opt


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_module_and_optimizer_state_round_trip_bit_for_bit(optimizer: str) -> None:
    # Prepare
    model, opt = _trained(0, optimizer)
    state = {"bottom": model.state_dict(), "optimizer": opt.state_dict()}

    # Execute
    restored = decode_state(*encode_state(state))

    # Assert: int keys of optimizer state, tuple betas, None and bool survive
    _assert_identical(state, restored)


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_training_continues_identically_from_the_decoded_state(optimizer: str) -> None:
    # Prepare: a trained pair and a differently initialised pair
    model, opt = _trained(0, optimizer)
    other, other_opt = _trained(1, optimizer)
    header, data = encode_state(
        {"bottom": model.state_dict(), "optimizer": opt.state_dict()}
    )
    state = decode_state(header, data)
    other.load_state_dict(state["bottom"])
    other_opt.load_state_dict(state["optimizer"])
    gen = torch.Generator().manual_seed(9)
    numeric = torch.randn(16, 5, generator=gen)
    categorical = torch.randint(0, 7, (16, 2), generator=gen)

    # Execute: one more step on each
    for m, o in ((model, opt), (other, other_opt)):
        o.zero_grad()
        m(numeric, categorical).sum().backward()
        o.step()

    # Assert
    for p, q in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.equal(p, q)


def test_every_dtype_shape_and_scalar_kind_round_trips() -> None:
    # Prepare
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    state = {
        "f32": base,
        "transposed": base.t(),  # not contiguous
        "f64": torch.tensor([1e-300, -0.0, math.inf, math.nan], dtype=torch.float64),
        "bf16": torch.tensor([1.5, -2.25], dtype=torch.bfloat16),
        "f16": torch.tensor([0.1], dtype=torch.float16),
        "i64": torch.tensor([-(2**62), 2**62]),
        "u8": torch.tensor([0, 255], dtype=torch.uint8),
        "bool": torch.tensor([True, False]),
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 5),
        7: {"nested": [1, 2.5, None, True, "text", (math.inf, -math.inf, math.nan)]},
        "big": 2**70,
        "tiny": 5e-324,
    }

    # Execute
    restored = decode_state(*encode_state(state))  # type: ignore[arg-type]

    # Assert
    _assert_identical(state, restored)
    assert restored["transposed"].is_contiguous()
    restored["f32"][0, 0] = 99.0  # writable, and not a view of the input
    assert base[0, 0] == 0.0


def test_unsupported_values_name_their_path() -> None:
    # Execute / Assert
    with pytest.raises(UnsupportedStateError, match=r"state\['a'\]\[1\]\['b'\]"):
        encode_state({"a": [1, {"b": object()}]})
    with pytest.raises(UnsupportedStateError, match=r"dict key True"):
        encode_state({"a": {True: 1}})
    with pytest.raises(UnsupportedStateError, match=r"dict key 1.5"):
        encode_state({1.5: 1})  # type: ignore[dict-item]


def test_malformed_header_or_data_is_rejected() -> None:
    # Prepare
    header, data = encode_state({"w": torch.ones(4)})

    # Execute / Assert
    with pytest.raises(ValueError, match="shorter"):
        decode_state(header, data[:-1])
    with pytest.raises(ValueError, match="describes 16"):
        decode_state(header, data + b"\0")
    with pytest.raises(ValueError, match="not JSON"):
        decode_state(header[:-1], data)
    with pytest.raises(ValueError, match="unknown tensor dtype"):
        decode_state(header.replace("float32", "float99"), data)


def _context(cfg: ExperimentConfig) -> Context:
    return Context(
        run_id=1,
        node_id=5,
        node_config={"partition-id": 0, "num-partitions": cfg.num_parties},
        state=RecordDict(),
        run_config=cfg.to_run_config(),
    )


def test_a_node_with_a_cold_cache_restores_its_party_from_context_state() -> None:
    # Prepare: one handler trains a step and saves into context.state
    cfg = ExperimentConfig(dataset="breast-cancer", noise_seed=0)
    context = _context(cfg)
    warm = NonLabelHandlers(builtin_party)
    party = warm._party(context)
    ids = np.arange(8)
    party.embed(ids, keep_graph=True)
    party.apply_gradient(ids, np.ones((8, cfg.embedding_dim), np.float32))
    warm._save(party, context)

    # Execute: a fresh handler (another process, as Flower may use) loads it
    restored = NonLabelHandlers(builtin_party)._party(context)

    # Assert
    _assert_identical(party.state_dict(), restored.state_dict())
    assert restored is not party


def test_state_the_codec_cannot_hold_falls_back_to_torch_save() -> None:
    # Prepare
    state = {"bottom": {"w": torch.ones(2)}, "extra": {1.5: "float key"}}

    # Execute
    record = client_app_module._state_record(state, version=3)
    restored = client_app_module._state_from_record(record)

    # Assert
    assert record["header"] == "" and record["version"] == 3
    assert restored["extra"] == {1.5: "float key"}
    assert torch.equal(restored["bottom"]["w"], torch.ones(2))


def test_an_engine_that_reuses_the_app_gets_only_the_version_stored() -> None:
    # Prepare: the in-process engine's record in the node's context.state.
    cfg = ExperimentConfig(dataset="breast-cancer", noise_seed=0)
    context = _context(cfg)
    context.state[P.APP_KEEPS_STATE] = ConfigRecord({"same-object": True})
    handlers = NonLabelHandlers(builtin_party)
    party = handlers._party(context)

    # Execute: two saves, then the next message.
    handlers._save(party, context)
    handlers._save(party, context)
    again = handlers._party(context)

    # Assert: the version counts on, no encoded state, the same live party.
    assert dict(context.state.config_records[STATE_KEY]) == {"version": 1}
    assert again is party


def test_a_kept_state_another_app_object_lacks_fails_closed() -> None:
    # Prepare: state kept in one handler object, then asked of another.
    cfg = ExperimentConfig(dataset="breast-cancer", noise_seed=0)
    context = _context(cfg)
    context.state[P.APP_KEEPS_STATE] = ConfigRecord({"same-object": True})
    warm = NonLabelHandlers(builtin_party)
    warm._save(warm._party(context), context)

    # Execute / Assert: no fresh party silently replaces the trained one.
    with pytest.raises(ProtocolError, match=r"version 0.*has none.*restarted since"):
        NonLabelHandlers(builtin_party)._party(context)


def test_keeping_the_state_in_the_app_trains_bit_for_bit_the_same(tmp_path) -> None:
    # Prepare: one seeded run, state encoded every step or kept in the app.
    cfg = ExperimentConfig(
        dataset="breast-cancer",
        epochs=2,
        batch_size=64,
        noise_seed=0,
        checkpoint=False,
        out_dir=str(tmp_path),
    )

    # Execute
    kept, kept_grid = run_inprocess_experiment(cfg, seed=3)
    encoded, encoded_grid = run_inprocess_experiment(cfg, seed=3, app_keeps_state=False)

    # Assert: the same losses and AUCs; only the encoded run stores the state.
    timing = {"seconds", "samples_per_second"}
    strip = [
        [{k: v for k, v in e.items() if k not in timing} for e in run["history"]]
        for run in (kept, encoded)
    ]
    assert strip[0] == strip[1] and len(strip[0]) == 2
    assert kept["test_auc"] == encoded["test_auc"]
    for node in kept_grid.nodes:
        assert "blob" not in node.context.state.config_records[STATE_KEY]
    for node in encoded_grid.nodes:
        assert len(node.context.state.config_records[STATE_KEY]["blob"]) > 0


def test_a_fresh_context_never_gets_another_runs_party() -> None:
    # Prepare: run A's node built its party and stopped before saving; run B
    # (a seeded grid: the same run and node ids) starts with a fresh context.
    cfg = ExperimentConfig(dataset="breast-cancer", noise_seed=0)
    handlers = NonLabelHandlers(builtin_party)
    party_a = handlers._party(_context(cfg))

    # Execute
    party_b = handlers._party(_context(cfg))

    # Assert: B's node is built from B's context, not taken from A.
    assert party_b is not party_a


def _kept_context(cfg: ExperimentConfig, run_id: int, node_id: int) -> Context:
    context = Context(
        run_id=run_id,
        node_id=node_id,
        node_config={"partition-id": node_id % 2, "num-partitions": 2},
        state=RecordDict({P.APP_KEEPS_STATE: ConfigRecord({"same-object": True})}),
        run_config=cfg.to_run_config(),
    )
    return context


def test_a_run_dropped_from_the_cache_says_so_and_names_resume() -> None:
    # Prepare: one long-lived handler object (the warm executor's) serves a
    # run, then KEEP_RUNS newer runs, one message each.
    cfg = ExperimentConfig(dataset="breast-cancer", noise_seed=0)
    handlers = NonLabelHandlers(builtin_party)
    runs = [_kept_context(cfg, run_id, 7) for run_id in range(1, KEEP_RUNS + 2)]
    parties = []
    for context in runs:
        parties.append(handlers._party(context))
        handlers._save(parties[-1], context)

    # Execute / Assert: the first run's next message is refused, saying why.
    with pytest.raises(ProtocolError) as refused:
        handlers._party(runs[0])
    reason = str(refused.value)
    assert reason.startswith("this node's state (version 0) was kept in the process")
    assert f"dropped run 1's party after serving {KEEP_RUNS} newer runs" in reason
    assert "resume the run (resume = true)" in reason
    assert "restarted" not in reason  # it was not: the cache let it go
    # ... and the KEEP_RUNS newer runs still find their own live parties.
    assert [handlers._party(c) for c in runs[1:]] == parties[1:]


def test_one_object_keeps_every_node_of_a_run_beyond_keep_runs() -> None:
    # Prepare: the in-process engine calls one object for all nodes of a run;
    # more nodes than KEEP_RUNS must not push each other out.
    cfg = ExperimentConfig(dataset="breast-cancer", noise_seed=0)
    handlers = NonLabelHandlers(builtin_party)
    nodes = [_kept_context(cfg, 1, node_id) for node_id in range(KEEP_RUNS + 2)]
    parties = []
    for context in nodes:
        parties.append(handlers._party(context))
        handlers._save(parties[-1], context)

    # Execute
    again = [handlers._party(context) for context in nodes]

    # Assert: every node finds its own live party, none rebuilt or refused.
    assert all(a is b for a, b in zip(again, parties, strict=True))


def test_more_nodes_than_keep_runs_train_in_process(tmp_path) -> None:
    # Prepare: KEEP_RUNS + 1 nodes on the in-process engine, state kept in
    # the app object (the engine's default).
    cfg = ExperimentConfig(
        dataset="breast-cancer",
        num_parties=KEEP_RUNS + 1,
        epochs=1,
        batch_size=64,
        noise_seed=0,
        checkpoint=False,
        out_dir=str(tmp_path),
    )

    # Execute
    results, _grid = run_inprocess_experiment(cfg, seed=3)

    # Assert: the run completed and learned (breast cancer: AUC well above 0.5).
    assert len(results["history"]) == 1
    assert results["test_auc"] > 0.9
