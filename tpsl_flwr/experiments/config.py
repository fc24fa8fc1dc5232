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
from pathlib import Path
from typing import Any

from tpsl_flwr._util.checks import check_int, check_placement, check_positive_finite
from tpsl_flwr.data import (
    ALL_DATASETS,
    FILE_DATASETS,
    DatasetSplit,
    DataSpec,
    LabelView,
    PartyColumns,
    PartyView,
    dataset_columns,
    load_dataset,
    load_label_view,
    load_party_view,
    partition_columns,
)
from tpsl_flwr.data.bundled import BUNDLED, bundled_rows
from tpsl_flwr.data.ctr.load import SPLITS
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.experiments.config_fields import coerce_value
from tpsl_flwr.experiments.training_settings import (
    check_training,
    heavy_label_noise,
    resolve_denoise,
)
from tpsl_flwr.experiments.wide_settings import check_wide, wide_mode
from tpsl_flwr.parties.weight_average import average_mode
from tpsl_flwr.privacy.mechanisms import Mechanism, make_mechanism
from tpsl_flwr.validation.holdout import validation_mode
from tpsl_flwr.wire.wire_dtype import check_wire_dtype

LABEL_DIR = "label-party"
_MAX_BUCKETS = 2**31 - 1
"""The most hash buckets a categorical column of criteo/avazu may have."""
"""The label party's folder under ``out_dir`` unless ``label_dir`` names one."""
LABEL_PARTY_ONLY = frozenset(
    {"noise_seed", "new_release", "privacy_budget", "release", "unprotected_release"}
)
"""Fields that never enter the run config (nodes must not learn them)."""


@dataclass(frozen=True)
class ExperimentConfig:
    """One TPSL experiment.

    ``epsilon`` applies to ``laplace``/``discrete``/``rr-prior``, ``sigma`` to
    ``gaussian``, ``marvell_power`` (the scale ``s`` of Marvell's power
    constraint ``P = s ||g1 - g0||^2``) to ``marvell``; ``max-norm`` takes none.
    ``noise_seed`` is label-party configuration, never run config (Flower hands
    the run config to every node, and whoever knows the seed can subtract the
    noise): ``< 0`` draws the noise key from the OS (secure); a seed makes the
    noise reproducible and is reported as not secure. ``label_dir`` is the label
    party's private folder (key, checkpoints; default ``out_dir/label-party``).
    ``rows = 0`` means the dataset's default size. ``criteo``/``avazu`` read
    ``data_path``, hashing categoricals into ``hash_buckets`` per column (0: the
    loader's default), and cache the encoded file in ``cache_dir`` (default
    ``.tpsl-cache`` beside the file; set it where the data is mounted
    read-only); ``split`` is ``random`` or ``time``. ``wide`` is
    ``auto``, ``on`` or ``off`` (``True``/``False`` are read as on/off);
    ``auto`` is resolved per run from the training rows
    (:func:`~tpsl_flwr.experiments.wide_settings.resolve_wide`). ``audit`` attacks the
    dispatched transcript every epoch: off here and in the app's run config
    (deployments), on by default in ``tpsl-flwr simulate`` and ``flower-run``.
    ``transcript_dir``, if set, makes every non-label node record what it
    receives there (the attacker's view, for ``tpsl-flwr attack``).
    ``new_release`` (the label party acknowledges a further release of labels
    the privacy ledger already holds) and ``privacy_budget`` (``> 0``: refuse a
    release taking the label set's total epsilon above it), ``release``
    (count the run as a release whatever its engine) and
    ``unprotected_release`` (allow a release with ``mechanism = none``) are
    label-party decisions, never run config (:mod:`tpsl_flwr.release.ledger`).
    """

    dataset: str = "synthetic-ctr"
    data_path: str = ""
    cache_dir: str = ""
    rows: int = 0
    test_fraction: float = 0.2
    split: str = "random"
    hash_buckets: int = 0
    mechanism: str = "laplace"
    epsilon: float = 1.0
    sigma: float = 1.0
    marvell_power: float = 1.0
    placement: str = "logits"
    reuse_noise: bool = True
    epochs: int = 2
    batch_size: int = 0
    lr: float = 0.0
    lr_schedule: str = "auto"
    weight_decay: float = 0.3
    model: str = "auto"
    wide: str | bool = "auto"
    wide_optimizer: str = "auto"
    wide_lr: float = 5.0
    wide_l1: float = 0.0
    wide_l2: float = 2.0
    validation_fraction: float | str = "auto"
    average: str | bool = "auto"
    denoise: str = "auto"
    denoise_prior: str = "model"
    steps_per_message: int = 1
    pipeline_depth: int = 0
    wire_dtype: str = "float32"
    party_actors: bool = False
    num_parties: int = 2
    embedding_dim: int = 8
    bottom_hidden: int = 64
    top_hidden: int = 64
    seed: int = 0
    noise_seed: int = -1
    new_release: bool = False
    privacy_budget: float = 0.0
    release: bool = False
    unprotected_release: bool = False
    out_dir: str = "outputs"
    label_dir: str = ""
    checkpoint: bool = True
    audit: bool = False
    transcript_dir: str = ""
    resume: bool = False
    reply_timeout: float = 60.0

    def __post_init__(self) -> None:
        """Check every setting and every combination, from public schema only.

        Runs before any process, actor or node starts (``simulate``,
        ``flower-run``, ``sweep`` and the ServerApp all build one first), so a
        bad value is refused with one line naming it. Reads no data: the
        columns and classes of a dataset are its public schema.

        Raises
        ------
        ConfigError
            Naming the first bad value (kebab-case, as in the run config).
        """
        # wide: true/false (TOML, Python) read as "on"/"off", one spelling after
        object.__setattr__(self, "wide", wide_mode(self.wide))
        object.__setattr__(
            self, "validation_fraction", validation_mode(self.validation_fraction)
        )
        object.__setattr__(self, "average", average_mode(self.average))
        if self.average == "on" and self.validation_fraction not in ("auto", 0.0):
            raise ConfigError(
                "average = on cannot go with validation-fraction = "
                f"{self.validation_fraction} (the run would restore its best "
                "held-out epoch): set validation-fraction = 0"
            )
        self._check_data()
        check_placement(self.placement)
        for name in (
            "epochs",
            "steps_per_message",
            "num_parties",
            "embedding_dim",
            "bottom_hidden",
            "top_hidden",
        ):
            check_int(getattr(self, name), name.replace("_", "-"))
        check_int(self.pipeline_depth, "pipeline-depth", 0)
        check_wire_dtype(self.wire_dtype)
        for name in ("seed", "noise_seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(
                    f"{name.replace('_', '-')} must be an integer, got {value!r}"
                )
        self._check_training()
        for name in ("out_dir", "label_dir", "transcript_dir", "cache_dir"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(
                    f"{name.replace('_', '-')} must be a string, "
                    f"got {getattr(self, name)!r}"
                )
        if not self.out_dir:
            raise ConfigError("out-dir must name a folder, got ''")
        check_positive_finite(self.reply_timeout, "reply-timeout")
        if self.privacy_budget != 0.0:
            check_positive_finite(self.privacy_budget, "privacy-budget")
        if self.resume and not self.checkpoint:
            raise ConfigError(
                "resume = true needs checkpoint = true (it continues from the "
                "last epoch checkpoint), got checkpoint = false"
            )
        # Validates mechanism, epsilon / sigma / marvell-power for the classes.
        self.make_mechanism(schema_classes(self.dataset))
        self._check_parties()

    def _check_training(self) -> None:
        """batch-size, lr (0: auto, :func:`.resolve_training`) and the rest."""
        check_training(self)
        check_wide(self)

    @property
    def split_model(self) -> str:
        """``model`` with ``auto`` resolved from the public schema.

        ``dlrm`` when the dataset has categorical columns (field vectors to take
        dot products of), else ``mlp``: on numeric-only tables each node would
        send one field, and the measured MLP was better there (digits, 3 nodes,
        discrete eps 4, 2 epochs: accuracy 0.55 against 0.42).
        """
        if self.model != "auto":
            return self.model
        _, categorical = dataset_columns(self.data_spec())
        return "dlrm" if categorical else "mlp"

    @property
    def label_denoise(self) -> str:
        """``denoise`` with ``auto`` resolved (:func:`.resolve_denoise`)."""
        k, eps = schema_classes(self.dataset), self.epsilon
        return resolve_denoise(self.denoise, self.mechanism, classes=k, epsilon=eps)

    @property
    def heavy_label_noise(self) -> bool:
        """Labels noisy enough for the posterior (:func:`.heavy_label_noise`)."""
        k, eps = schema_classes(self.dataset), self.epsilon
        return heavy_label_noise(self.mechanism, classes=k, epsilon=eps)

    def _check_data(self) -> None:
        """Dataset, data-path, split, test-fraction, rows and hash-buckets."""
        name = self.dataset
        if name not in ALL_DATASETS:
            raise ConfigError(
                f"unknown dataset {name!r}; valid datasets: {', '.join(ALL_DATASETS)}"
            )
        if not isinstance(self.data_path, str):
            raise ConfigError(f"data-path must be a string, got {self.data_path!r}")
        is_file = name in FILE_DATASETS
        if is_file:
            if not self.data_path:
                raise ConfigError(f"dataset {name!r} needs data-path (a file)")
            path = Path(self.data_path).expanduser()
            if not path.is_file():
                why = "is not a file" if path.exists() else "does not exist"
                raise ConfigError(
                    f"data-path {self.data_path!r} of dataset {name!r} {why}"
                )
        elif self.data_path:
            raise ConfigError(
                f"data-path applies only to {', '.join(FILE_DATASETS)}; dataset "
                f"{name!r} is built in, got data-path={self.data_path!r}"
            )
        if self.cache_dir and not is_file:
            raise ConfigError(
                f"cache-dir applies only to {', '.join(FILE_DATASETS)}; dataset "
                f"{name!r} is built in, got cache-dir={self.cache_dir!r}"
            )
        if self.split not in SPLITS:
            raise ConfigError(
                f"split must be one of {', '.join(SPLITS)}, got {self.split!r}"
            )
        if self.split == "time" and not is_file:
            raise ConfigError(
                f"split='time' applies only to {', '.join(FILE_DATASETS)}; "
                f"dataset {name!r} takes split='random'"
            )
        fraction = self.test_fraction
        if (
            isinstance(fraction, bool)
            or not isinstance(fraction, int | float)
            or not 0.0 < fraction < 1.0
        ):
            raise ConfigError(f"test-fraction must be in (0, 1), got {fraction!r}")
        check_int(self.rows, "rows", minimum=0)
        if name in BUNDLED and self.rows:
            bundled_rows(name, self.rows, 0)  # rows=N exceeds the table's rows
        if name == "synthetic-ctr" and self.rows == 1:
            raise ConfigError(
                "rows of 'synthetic-ctr' must be 0 (default) or >= 2, got 1"
            )
        check_int(self.hash_buckets, "hash-buckets", minimum=0)
        if self.hash_buckets and not is_file:
            raise ConfigError(
                f"hash-buckets applies only to {', '.join(FILE_DATASETS)}; dataset "
                f"{name!r} takes 0, got {self.hash_buckets}"
            )
        if self.hash_buckets == 1 or self.hash_buckets > _MAX_BUCKETS:
            raise ConfigError(
                f"hash-buckets must be 0 (default) or in [2, {_MAX_BUCKETS}], "
                f"got {self.hash_buckets}"
            )
        self.data_spec()  # the data layer's own checks, as a last guard

    def _check_parties(self) -> None:
        """``num-parties`` against the dataset's columns (its public schema)."""
        numeric, categorical = dataset_columns(self.data_spec())
        columns = len(numeric) + len(categorical)
        if self.num_parties > columns:
            raise ConfigError(
                f"num_parties={self.num_parties} exceeds the number of columns "
                f"({columns}) of {self.dataset!r}"
            )
        partition_columns(numeric, categorical, self.num_parties)

    def data_spec(self) -> DataSpec:
        """The public settings that fix the records and the id space."""
        return DataSpec(
            self.dataset,
            data_path=self.data_path,
            rows=self.rows or None,
            seed=self.seed,
            test_fraction=self.test_fraction,
            split=self.split,
            hash_buckets=self.hash_buckets or None,
        )

    def party_columns(self, partition: int) -> PartyColumns:
        """Partition ``partition``'s columns (from the public schema only)."""
        numeric, categorical = dataset_columns(self.data_spec())
        return partition_columns(numeric, categorical, self.num_parties)[partition]

    def load_labels(self) -> LabelView:
        """The label party's view: labels and ids, no feature column parsed."""
        return load_label_view(self.data_spec(), cache_dir=self._cache_folder())

    def load_party(self, partition: int) -> PartyView:
        """A non-label node's view: its own columns and ids, no label parsed."""
        return load_party_view(
            self.data_spec(),
            self.party_columns(partition).names,
            cache_dir=self._cache_folder(),
        )

    def _cache_folder(self) -> str | None:
        """``cache_dir``, or None for the loaders' default beside the file."""
        return self.cache_dir or None

    def load_data(self) -> DatasetSplit:
        """The whole labelled table, for experimenters (central baselines, benches).

        No party of a run calls this: the label party uses :meth:`load_labels`,
        each node :meth:`load_party`.
        """
        return _load_data(
            self.dataset,
            self.data_path,
            self.rows,
            self.seed,
            self.test_fraction,
            self.split,
            self.hash_buckets,
            self.cache_dir,
        )

    def make_mechanism(self, num_classes: int) -> Mechanism:
        """The configured mechanism for ``num_classes`` classes.

        It takes the parameter it declares (``epsilon``, ``sigma`` or
        ``marvell_power``) and ignores the others.
        """
        return make_mechanism(
            self.mechanism,
            epsilon=self.epsilon,
            sigma=self.sigma,
            marvell_power=self.marvell_power,
            num_classes=num_classes,
        )

    @property
    def label_party_dir(self) -> Path:
        """The label party's private folder (``label_dir``, or under ``out_dir``)."""
        return (
            Path(self.label_dir) if self.label_dir else Path(self.out_dir) / LABEL_DIR
        )

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> ExperimentConfig:
        """Parse a Flower run config (kebab-case keys); unknown keys are errors.

        ``noise-seed`` is refused: the run config reaches every node.
        """
        fields = {
            f.name: f for f in dataclasses.fields(cls) if f.name not in LABEL_PARTY_ONLY
        }
        values: dict[str, Any] = {}
        for key, raw in run_config.items():
            name = key.replace("-", "_")
            if name in LABEL_PARTY_ONLY:
                raise ConfigError(
                    f"{key} is not a run-config key: Flower hands the run config to "
                    "every node, and this is the label party's alone; give it to "
                    f"the label party only (tpsl-flwr simulate/flower-run --{key}, "
                    "tpsl-flwr keygen --seed, tpsl-flwr ledger acknowledge)"
                )
            if name not in fields:
                valid = ", ".join(sorted(n.replace("_", "-") for n in fields))
                raise ConfigError(
                    f"unknown run-config key {key!r}; valid keys: {valid}"
                )
            values[name] = coerce_value(key, raw, fields[name].type)
        return cls(**values)

    def to_run_config(self) -> dict[str, Any]:
        """The kebab-case run config Flower passes to both apps (no noise seed)."""
        return {
            k.replace("_", "-"): v
            for k, v in dataclasses.asdict(self).items()
            if k not in LABEL_PARTY_ONLY
        }


def schema_classes(dataset: str) -> int:
    """The number of classes of ``dataset``, from its public schema (no data).

    Examples
    --------
    >>> schema_classes("digits"), schema_classes("synthetic-ctr")
    (10, 2)
    """
    return BUNDLED[dataset][3] if dataset in BUNDLED else 2


@lru_cache(maxsize=4)
def _load_data(
    dataset: str,
    data_path: str,
    rows: int,
    seed: int,
    test_fraction: float,
    split: str,
    hash_buckets: int,
    cache_dir: str,
) -> DatasetSplit:
    # Cached per process: a ClientApp is rebuilt for every message it handles.
    file_options: dict[str, Any] = {}
    if dataset in FILE_DATASETS:
        file_options = {"data_path": data_path, "split": split}
        if cache_dir:
            file_options["cache_dir"] = cache_dir
        if hash_buckets:
            file_options["hash_buckets"] = hash_buckets
    return load_dataset(
        dataset,
        rows=rows or None,
        seed=seed,
        test_fraction=test_fraction,
        **file_options,
    )
