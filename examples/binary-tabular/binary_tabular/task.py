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

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tpsl_flwr import NonLabelParty, TPSLStrategy, adam
from tpsl_flwr.models import BottomModel, TopModel

APP_DIR = Path(__file__).resolve().parents[1]
"""The app folder (holds ``pyproject.toml``); relative paths resolve against it."""

LABEL_FILE = "labels.csv"
NUM_CLASSES = 2
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
    mechanism: str = "laplace"
    epsilon: float = 1.0
    epochs: int = 3
    batch_size: int = 128
    lr: float = 0.003
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
    """The label party's data: train labels, test labels, their record ids.

    Reads ``labels.csv`` only; no feature file is opened. The record ids are
    the train labels' then the test labels', in wire-id order.
    """
    ids, values, _ = read_table(Path(data_dir) / LABEL_FILE)
    labels = values[:, 0].astype(np.int64)
    rows = split_rows(ids)
    order = np.concatenate([rows["train"], rows["test"]])
    return labels[rows["train"]], labels[rows["test"]], ids[order]


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
    top = TopModel(
        cfg.num_parties * cfg.embedding_dim,
        hidden=(cfg.hidden,),
        num_outputs=1,
        generator=torch.Generator().manual_seed(cfg.seed),
    )
    # One call: the mechanism, the noise key bound to these settings, the
    # release (recorded in the label party's privacy ledger before any
    # gradient leaves; a further release of the same labels is refused unless
    # acknowledged: `tpsl-flwr ledger acknowledge LABEL_DIR`), checkpoints.
    return TPSLStrategy.for_labels(
        top,
        train_labels=train_labels,
        test_labels=test_labels,
        record_ids=record_ids,
        num_classes=NUM_CLASSES,
        mechanism=cfg.mechanism,
        epsilon=None if cfg.mechanism == "none" else cfg.epsilon,  # none: baseline
        epochs=cfg.epochs,
        batch_size=cfg.batch_size,
        lr=cfg.lr,
        order_seed=cfg.seed,
        num_nodes=cfg.num_parties,
        label_dir=cfg.label_dir,
        id_space={"dataset": "binary-tabular"},
        run_name="binary-tabular",
    )


def results_of(result: Any, strategy: TPSLStrategy, cfg: AppConfig) -> dict[str, Any]:
    """The run's results: final test metrics, epsilon, history."""
    last = strategy.final_metrics  # the returned model's (its average from 5 epochs)
    return {
        "test_auc": last.get("test_auc"),
        "test_accuracy": last.get("test_accuracy"),
        "epsilon_spent": result.epsilon_spent,
        "epsilon_total": result.epsilon_total,
        "mechanism": cfg.mechanism,
        "epsilon": cfg.epsilon,
        "epochs": cfg.epochs,
        "history": strategy.history,
        "note": result.note,
    }
