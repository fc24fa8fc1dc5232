"""Models, data loading and the label party's strategy (no Flower handlers here).

Data layout (written by ``prepare_data.py``), one CSV file per party:

* ``labels.csv``: ``record_id,label``; only the label party (ServerApp) reads it.
* ``party-<i>.csv``: ``record_id,<its feature columns>``; only node ``i``
  (ClientApp with ``partition-id = i``) reads it.

Train/test membership is a function of the record id alone
(:func:`is_test`). Within each split the ids on the wire are positions
``0..n-1`` in increasing record-id order, at every node and at the label
party, so the rows of the files may come in any order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tpsl_flwr import make_mechanism
from tpsl_flwr.models import BottomModel, TopModel
from tpsl_flwr.parties import LabelParty, NonLabelParty, adam
from tpsl_flwr.privacy.accounting import privacy_spent
from tpsl_flwr.release import LabelRecords, LabelStore, NoiseBinding
from tpsl_flwr.strategies import TPSLStrategy

APP_DIR = Path(__file__).resolve().parents[1]
"""The app folder (holds ``pyproject.toml``); relative paths resolve against it."""

LABEL_FILE = "labels.csv"
NUM_CLASSES = 4
TEST_EVERY = 5
"""Record ``i`` is a test record iff ``i % TEST_EVERY == 0`` (20%)."""


def party_file(partition: int) -> str:
    """The feature file of non-label party ``partition``."""
    return f"party-{partition}.csv"


def resolve(path: str | Path) -> Path:
    """``path`` made absolute: relative paths are taken from :data:`APP_DIR`."""
    path = Path(path).expanduser()
    return path if path.is_absolute() else (APP_DIR / path).resolve()


@dataclass(frozen=True)
class AppConfig:
    """The run config (``[tool.flwr.app.config]``), parsed once and typed."""

    num_parties: int = 2
    mechanism: str = "discrete"
    epsilon: float = 2.0
    epochs: int = 3
    batch_size: int = 128
    lr: float = 0.01
    embedding_dim: int = 8
    hidden: int = 32
    seed: int = 0
    data_dir: Path = APP_DIR / "data"
    out_dir: Path = APP_DIR / "outputs"
    checkpoint_dir: Path = APP_DIR / "checkpoints"

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> AppConfig:
        """Read the kebab-case keys; paths become absolute (:func:`resolve`)."""
        default = cls()

        def get(key: str, kind: type) -> Any:
            value = run_config.get(key, getattr(default, key.replace("-", "_")))
            return resolve(value) if kind is Path else kind(value)

        return cls(
            num_parties=get("num-parties", int),
            mechanism=get("mechanism", str),
            epsilon=get("epsilon", float),
            epochs=get("epochs", int),
            batch_size=get("batch-size", int),
            lr=get("lr", float),
            embedding_dim=get("embedding-dim", int),
            hidden=get("hidden", int),
            seed=get("seed", int),
            data_dir=get("data-dir", Path),
            out_dir=get("out-dir", Path),
            checkpoint_dir=get("checkpoint-dir", Path),
        )

    @property
    def label_dir(self) -> Path:
        """The label party's private folder: its noise key and checkpoints."""
        return self.checkpoint_dir / "label-party"


# --------------------------------------------------------------------- data
def is_test(record_ids: np.ndarray) -> np.ndarray:
    """Test membership from the record id alone (never from a label)."""
    return np.asarray(record_ids) % TEST_EVERY == 0


def read_table(path: Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """A party's CSV file: ``(record ids, values, column names)``, by record id.

    Raises
    ------
    FileNotFoundError
        If the file is missing (with a hint to run ``prepare_data.py``).
    ValueError
        If the first column is not ``record_id``.
    """
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: run `python prepare_data.py` first, and give "
            "`flwr run` an absolute data-dir (Flower runs an installed copy of "
            "the app's code, without its data)"
        )
    with path.open(encoding="utf-8") as handle:
        header = handle.readline().strip().split(",")
        if header[0] != "record_id":
            raise ValueError(f"{path}: first column must be record_id, got {header}")
        table = np.loadtxt(handle, delimiter=",", ndmin=2)
    order = np.argsort(table[:, 0], kind="stable")
    return table[order, 0].astype(np.int64), table[order, 1:], header[1:]


def split_rows(record_ids: np.ndarray) -> dict[str, np.ndarray]:
    """Row positions of each split, in increasing record-id order (= wire ids)."""
    test = is_test(record_ids)
    return {"train": np.flatnonzero(~test), "test": np.flatnonzero(test)}


def load_labels(data_dir: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The label party's data: train labels, test labels and all record ids.

    Reads ``labels.csv`` only; no feature file is opened.
    """
    ids, values, _ = read_table(Path(data_dir) / LABEL_FILE)
    labels = values[:, 0].astype(np.int64)
    rows = split_rows(ids)
    return labels[rows["train"]], labels[rows["test"]], ids


def label_records(data_dir: Path) -> LabelRecords:
    """Every label with its record id (train and test): the set the ledger tracks."""
    ids, values, _ = read_table(Path(data_dir) / LABEL_FILE)
    return LabelRecords(ids, values[:, 0].astype(np.int64))


def load_features(
    data_dir: Path, partition: int
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A node's data: its own columns per split, as ``(numeric, categorical)``.

    Reads ``party-<partition>.csv`` only: never the label file. Columns are
    standardised with the training split's mean and deviation (label-free).
    """
    ids, values, _ = read_table(Path(data_dir) / party_file(partition))
    rows = split_rows(ids)
    train = values[rows["train"]]
    mean, std = train.mean(axis=0), train.std(axis=0) + 1e-8
    out = {}
    for split, positions in rows.items():
        numeric = ((values[positions] - mean) / std).astype(np.float32)
        categorical = np.zeros((positions.size, 0), dtype=np.int64)
        out[split] = (numeric, categorical)
    return out


# ------------------------------------------------------------------- models
def make_bottom(num_features: int, cfg: AppConfig, partition: int) -> BottomModel:
    """Node ``partition``'s bottom model (seeded from the public seed)."""
    generator = torch.Generator().manual_seed(cfg.seed * 1000 + partition + 1)
    return BottomModel(
        num_features,
        [],
        hidden=(cfg.hidden,),
        out_dim=cfg.embedding_dim,
        generator=generator,
    )


def make_party(cfg: AppConfig, partition: int) -> NonLabelParty:
    """Non-label party ``partition``: its own features and bottom model."""
    features = load_features(cfg.data_dir, partition)
    bottom = make_bottom(features["train"][0].shape[1], cfg, partition)
    return NonLabelParty(features, bottom, adam(cfg.lr))


def build_strategy(
    run_config: Mapping[str, Any], data_dir: str | Path | None = None
) -> TPSLStrategy:
    """The label party: labels, top model, mechanism, a fresh noise key.

    Parameters
    ----------
    run_config
        The run config (kebab-case keys of ``[tool.flwr.app.config]``).
    data_dir
        Overrides the run config's ``data-dir``.

    Returns
    -------
    TPSLStrategy
        Ready for ``strategy.start(grid=grid)``.
    """
    cfg = AppConfig.from_run_config(run_config)
    if data_dir is not None:
        cfg = AppConfig(**{**asdict(cfg), "data_dir": resolve(data_dir)})
    train_labels, test_labels, record_ids = load_labels(cfg.data_dir)
    epsilon = None if cfg.mechanism == "none" else cfg.epsilon  # none: baseline
    mechanism = make_mechanism(cfg.mechanism, epsilon=epsilon, num_classes=NUM_CLASSES)
    store = LabelStore(cfg.label_dir)
    id_space = {
        "dataset": "multiclass-tabular",
        "test-rule": f"record_id % {TEST_EVERY} == 0",
        "ids": hashlib.sha256(record_ids.tobytes()).hexdigest()[:16],
    }
    binding = NoiseBinding.of(
        mechanism=mechanism, placement="logits", reuse_noise=True, id_space=id_space
    )
    # A fresh release, recorded in the label party's privacy ledger before any
    # gradient leaves; a further release of the same labels is refused unless
    # acknowledged (`tpsl-flwr ledger acknowledge LABEL_DIR`).
    release = store.open_release(
        binding,
        resume=False,
        labels=label_records(cfg.data_dir),
        privacy=privacy_spent(mechanism=mechanism, epochs=cfg.epochs),
        run_name="multiclass-tabular",
    )
    top = TopModel(
        cfg.num_parties * cfg.embedding_dim,
        hidden=(cfg.hidden,),
        num_outputs=NUM_CLASSES,
        generator=torch.Generator().manual_seed(cfg.seed),
    )
    party = LabelParty(
        top, train_labels, mechanism, release.key, optimizer=adam(cfg.lr)
    )
    return TPSLStrategy(
        party,
        test_labels=test_labels,
        batch_size=cfg.batch_size,
        epochs=cfg.epochs,
        order_seed=cfg.seed,
        num_nodes=cfg.num_parties,
        store=store,
        release=release,
    )


def results_of(result: Any, strategy: TPSLStrategy, cfg: AppConfig) -> dict[str, Any]:
    """The run's results: final test metrics, epsilon, history."""
    last = strategy.history[-1] if strategy.history else {}
    return {
        "test_accuracy": last.get("test_accuracy"),
        "epsilon_spent": result.epsilon_spent,
        "epsilon_total": result.epsilon_total,
        "mechanism": cfg.mechanism,
        "epsilon": cfg.epsilon,
        "epochs": cfg.epochs,
        "history": strategy.history,
        "note": result.note,
    }
