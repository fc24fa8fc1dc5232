"""The label party's side of an experiment: build it, run it, write its results.

Shared by the ServerApp (``flwr run``), the in-process engine and
``tpsl-flwr simulate``; the results JSON has one schema for all of them.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.serverapp import Grid

from tpsl_flwr.accounting import privacy_spent
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.keyed_noise import NoiseKey
from tpsl_flwr.models import TopModel, num_outputs_for
from tpsl_flwr.parties import LabelParty, adam
from tpsl_flwr.simulations.config import ExperimentConfig
from tpsl_flwr.simulations.run_report import write_report
from tpsl_flwr.strategies import TPSLStrategy

RESULTS_FILE = "results.json"
CHECKPOINT_FILE = "label-party.pt"
EVALUATION_LABELS = "evaluation-train-labels.npy"


def checkpoint_path(cfg: ExperimentConfig) -> Path:
    """The label party's own checkpoint (holds the secret noise key)."""
    return Path(cfg.out_dir) / "checkpoints" / CHECKPOINT_FILE


def build_strategy(cfg: ExperimentConfig) -> tuple[TPSLStrategy, dict[str, Any]]:
    """The label party for ``cfg`` (its labels only) and facts about the data."""
    data = cfg.load_data()
    num_classes = data.num_classes
    mechanism = cfg.make_mechanism(num_classes)
    generator = torch.Generator().manual_seed(cfg.seed)
    top = TopModel(
        cfg.num_parties * cfg.embedding_dim,
        hidden=(cfg.top_hidden,),
        num_outputs=num_outputs_for(num_classes),
        generator=generator,
    )
    path = checkpoint_path(cfg)
    saved: dict[str, Any] | None = None
    if cfg.resume and path.exists():
        saved = torch.load(path, weights_only=False)
        key = NoiseKey.from_hex(
            saved["party"]["key"], secure=saved["party"]["key_secure"]
        )
    else:
        key = cfg.make_key()
    party = LabelParty(
        top,
        data.train.labels,
        mechanism,
        key,
        placement=cfg.placement,
        optimizer=adam(cfg.lr),
        reuse_noise=cfg.reuse_noise,
    )
    strategy = TPSLStrategy(
        party,
        test_labels=data.test.labels,
        batch_size=cfg.batch_size,
        epochs=cfg.epochs,
        steps_per_message=cfg.steps_per_message,
        order_seed=cfg.seed,
        num_nodes=cfg.num_parties,
        audit=cfg.audit,
    )
    if saved is not None:
        party.load_state_dict(saved["party"])
        strategy.start_epoch = int(saved["epoch"]) + 1
        strategy.history = list(saved["history"])
    if cfg.checkpoint:
        strategy.on_epoch_end = lambda epoch, _entry: _save_checkpoint(
            strategy, cfg, epoch
        )
    facts = {
        "dataset": data.name,
        "num_classes": num_classes,
        "train_rows": len(data.train),
        "test_rows": len(data.test),
        "data_info": {k: _jsonable(v) for k, v in data.info.items()},
    }
    return strategy, facts


def _save_checkpoint(strategy: TPSLStrategy, cfg: ExperimentConfig, epoch: int) -> None:
    path = checkpoint_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "epoch": epoch,
            "history": strategy.history,
            "party": strategy.party.state_dict(),
        },
        tmp,
    )
    tmp.replace(path)


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return value


def run_label_party(
    grid: Grid, cfg: ExperimentConfig, engine: str, timeout: float = 3600
) -> dict[str, Any]:
    """Run the experiment's label party on ``grid``; write and return the results."""
    if cfg.resume and not cfg.checkpoint:
        raise ConfigError("resume needs checkpoint = true")
    started = time.perf_counter()
    strategy, facts = build_strategy(cfg)
    strategy.start(grid=grid, timeout=timeout)
    spent = privacy_spent(
        strategy.party.mechanism, cfg.placement, cfg.epochs, cfg.reuse_noise
    )
    history = strategy.history
    final = history[-1] if history else {}
    rates = [h["samples_per_second"] for h in history]
    results: dict[str, Any] = {
        "engine": engine,
        "mechanism": cfg.mechanism,
        "epsilon": cfg.epsilon if cfg.mechanism in ("laplace", "discrete") else None,
        "sigma": cfg.sigma if cfg.mechanism == "gaussian" else None,
        "placement": cfg.placement,
        "epochs": cfg.epochs,
        "epsilon_spent": spent.to_dict()["epsilon"],
        "privacy": spent.to_dict(),
        "samples_per_second": float(np.mean(rates)) if rates else 0.0,
        "seconds": time.perf_counter() - started,
        "num_parties": len(strategy.nodes),
        "noise_key": {
            "secure": strategy.party.key.secure,
            "fingerprint": strategy.party.key.fingerprint,
        },
        "config": cfg.to_run_config(),
        "history": history,
        **facts,
    }
    for key in ("test_auc", "test_accuracy", "test_logloss"):
        if key in final:
            results[key] = final[key]
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.transcript_dir:
        # Ground truth for scoring the recorded transcript offline
        # (`tpsl-flwr attack`): the experimenter's file, not a message.
        np.save(out / EVALUATION_LABELS, strategy.party.labels)
        results["evaluation_labels"] = str(out / EVALUATION_LABELS)
    (out / RESULTS_FILE).write_text(json.dumps(results, indent=2, default=_jsonable))
    write_report(results, out)
    return results
