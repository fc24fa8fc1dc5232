"""The experiment configuration: Flower run config (kebab-case) <-> typed dataclass.

Parsed once, as Flower baselines do: ``[tool.flwr.app.config]`` in
``pyproject.toml`` gives the defaults, ``flwr run --run-config`` and
``tpsl-flwr simulate`` flags override them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from tpsl_flwr.data import ALL_DATASETS, FILE_DATASETS, DatasetSplit, load_dataset
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.keyed_noise import NoiseKey
from tpsl_flwr.mechanisms import Mechanism, make_mechanism
from tpsl_flwr.validation import check_int, check_placement


@dataclass(frozen=True)
class ExperimentConfig:
    """One TPSL experiment.

    ``epsilon`` applies to ``laplace``/``discrete``, ``sigma`` to ``gaussian``.
    ``noise_seed < 0`` draws the noise key from the OS (secure); a seed makes
    the noise reproducible and is reported as not secure. ``rows <= 0`` means
    the dataset's default size. ``criteo``/``avazu`` read ``data_path``,
    hashing categoricals into ``hash_buckets`` per column (0: the loader's
    default); ``split`` is ``random`` or ``time``. ``audit`` attacks the
    dispatched transcript every epoch: off here and in the app's run config
    (deployments), on by default in ``tpsl-flwr simulate`` and ``flower-run``.
    ``transcript_dir``, if set, makes every non-label node record what it
    receives there (the attacker's view, for ``tpsl-flwr attack``).
    """

    dataset: str = "synthetic-ctr"
    data_path: str = ""
    rows: int = 0
    test_fraction: float = 0.2
    split: str = "random"
    hash_buckets: int = 0
    mechanism: str = "laplace"
    epsilon: float = 1.0
    sigma: float = 1.0
    placement: str = "logits"
    reuse_noise: bool = True
    epochs: int = 2
    batch_size: int = 256
    lr: float = 1e-2
    steps_per_message: int = 1
    num_parties: int = 2
    embedding_dim: int = 16
    bottom_hidden: int = 64
    top_hidden: int = 64
    seed: int = 0
    noise_seed: int = -1
    out_dir: str = "outputs"
    checkpoint: bool = True
    audit: bool = False
    transcript_dir: str = ""
    resume: bool = False

    def __post_init__(self) -> None:
        if self.dataset not in ALL_DATASETS:
            raise ConfigError(
                f"unknown dataset {self.dataset!r}; "
                f"valid datasets: {', '.join(ALL_DATASETS)}"
            )
        if self.dataset in FILE_DATASETS and not self.data_path:
            raise ConfigError(f"dataset {self.dataset!r} needs data-path (a file)")
        check_placement(self.placement)
        for name in (
            "epochs",
            "batch_size",
            "steps_per_message",
            "num_parties",
            "embedding_dim",
            "bottom_hidden",
            "top_hidden",
        ):
            check_int(getattr(self, name), name.replace("_", "-"))
        if not self.lr > 0:
            raise ConfigError(f"lr must be > 0, got {self.lr}")
        self.make_mechanism(2)  # validates mechanism, epsilon / sigma

    def load_data(self) -> DatasetSplit:
        """The experiment's data (each party keeps only its own part of it)."""
        return _load_data(
            self.dataset,
            self.data_path,
            self.rows,
            self.seed,
            self.test_fraction,
            self.split,
            self.hash_buckets,
        )

    def make_mechanism(self, num_classes: int) -> Mechanism:
        """The configured mechanism for ``num_classes`` classes."""
        if self.mechanism in ("laplace", "discrete"):
            return make_mechanism(
                self.mechanism, epsilon=self.epsilon, num_classes=num_classes
            )
        if self.mechanism == "gaussian":
            return make_mechanism("gaussian", sigma=self.sigma, num_classes=num_classes)
        return make_mechanism(self.mechanism, num_classes=num_classes)

    def make_key(self) -> NoiseKey:
        """The noise key: from the OS, or from ``noise_seed`` (not secure)."""
        if self.noise_seed < 0:
            return NoiseKey.from_os()
        return NoiseKey.from_seed(self.noise_seed)

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> ExperimentConfig:
        """Parse a Flower run config (kebab-case keys); unknown keys are errors."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for key, raw in run_config.items():
            name = key.replace("-", "_")
            if name not in fields:
                valid = ", ".join(sorted(n.replace("_", "-") for n in fields))
                raise ConfigError(
                    f"unknown run-config key {key!r}; valid keys: {valid}"
                )
            values[name] = _coerce(key, raw, fields[name].type)
        return cls(**values)

    def to_run_config(self) -> dict[str, Any]:
        """The kebab-case run config Flower passes to both apps."""
        return {k.replace("_", "-"): v for k, v in dataclasses.asdict(self).items()}


def _coerce(key: str, raw: Any, kind: object) -> Any:
    kind_name = kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))
    try:
        if kind_name == "bool":
            if isinstance(raw, str):
                if raw.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(raw)
                return raw.lower() in ("true", "1")
            return bool(raw)
        if kind_name == "int":
            if isinstance(raw, float) and not raw.is_integer():
                raise ValueError(raw)
            return int(raw)
        if kind_name == "float":
            return float(raw)
        return str(raw)
    except (TypeError, ValueError):
        raise ConfigError(
            f"run-config {key} must be a {kind_name}, got {raw!r}"
        ) from None


@lru_cache(maxsize=4)
def _load_data(
    dataset: str,
    data_path: str,
    rows: int,
    seed: int,
    test_fraction: float,
    split: str,
    hash_buckets: int,
) -> DatasetSplit:
    # Cached per process: a ClientApp is rebuilt for every message it handles.
    file_options: dict[str, Any] = {}
    if dataset in FILE_DATASETS:
        file_options = {"data_path": data_path, "split": split}
        if hash_buckets:
            file_options["hash_buckets"] = hash_buckets
    return load_dataset(
        dataset,
        rows=rows or None,
        seed=seed,
        test_fraction=test_fraction,
        **file_options,
    )
