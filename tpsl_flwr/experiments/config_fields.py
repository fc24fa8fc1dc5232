"""The run config's documentation: one line of help per key, and the choices.

:mod:`tpsl_flwr.cli.flags` turns these into ``tpsl-flwr simulate``
flags; :class:`~tpsl_flwr.experiments.config.ExperimentConfig` checks values
against the choices.
"""

from __future__ import annotations

from typing import Any

from tpsl_flwr._util.checks import PLACEMENTS
from tpsl_flwr.data import ALL_DATASETS
from tpsl_flwr.data.ctr.load import SPLITS
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.parties import training_rules
from tpsl_flwr.parties.weight_average import AVERAGE_MODES
from tpsl_flwr.privacy import posterior
from tpsl_flwr.privacy.mechanisms import MECHANISMS
from tpsl_flwr.wire.protocol import parse_bool
from tpsl_flwr.wire.wire_dtype import WIRE_DTYPES

LR_SCHEDULES: tuple[str, ...] = training_rules.SCHEDULE_CHOICES
"""Learning-rate schedules of every party's optimizer."""
DENOISERS: tuple[str, ...] = ("auto", *posterior.DENOISERS)
"""What the label party trains on; ``auto`` is resolved per mechanism."""
DENOISE_PRIORS = posterior.DENOISE_PRIORS
"""Where the posterior's prior comes from."""
WIDE_MODES: tuple[str, ...] = ("auto", "on", "off")
"""Values of ``wide`` (``true``/``false`` are read as ``on``/``off``); ``auto``
is resolved by :func:`~tpsl_flwr.experiments.wide_settings.resolve_wide`."""
WIDE_OPTIMIZERS: tuple[str, ...] = ("auto", "adam", "ftrl")
"""Optimizers of the wide part: the run's Adam(W), or FTRL-proximal; ``auto``
is resolved with ``wide``."""
MODELS: tuple[str, ...] = ("auto", "dlrm", "mlp")
"""Split-model architectures: field vectors and dot products, or one MLP a side;
``auto`` is resolved from the dataset's columns."""

FIELD_HELP: dict[str, str] = {
    "dataset": "the dataset every party reads its columns of",
    "data-path": "the Criteo/Avazu file (plain or .gz); needed by criteo and avazu",
    "cache-dir": "criteo/avazu: folder of the encoded-file cache (default: "
    "'.tpsl-cache' beside the data file; set it for read-only data mounts)",
    "rows": "rows to load (0: the dataset's default size)",
    "test-fraction": "probability of a record being a test record, in (0, 1)",
    "split": "test records drawn at random by id, or by time (criteo/avazu "
    "only: the last days or the last rows in file order)",
    "hash-buckets": "criteo/avazu: hash buckets per categorical column "
    "(0: the loader's default)",
    "mechanism": "the label-DP mechanism of GradPerturb (none: no protection)",
    "epsilon": "privacy budget of laplace, discrete and rr-prior",
    "sigma": "noise std of gaussian",
    "marvell-power": "marvell's power constraint P = s ||g1 - g0||^2: the scale s",
    "placement": "where GradPerturb applies: the logits (Section 4.2) or the cut "
    "layer (Algorithm 3)",
    "reuse-noise": "draw each sample's noise once and reuse it every epoch "
    "(epsilon is spent once, not per epoch)",
    "epochs": "training epochs",
    "batch-size": "samples per training step; 0: auto, from the training rows "
    "(the largest of 32, 64, 128, 256 giving each epoch 64 steps)",
    "lr": "Adam learning rate of every model; 0: auto, from the run's optimizer "
    "steps (3e-3 for 4000 steps or more, up to 1e-2 for short runs; 1e-3 beside "
    "an ftrl wide part); on at most 50000 training rows beside ftrl or with noisy "
    "labels, more than 2 epochs take the 2-epoch rate times 2 / epochs (1 / "
    "epochs with noisy labels and 64 steps an epoch or more); a resume keeps the "
    "stopped run's rate (another is refused)",
    "lr-schedule": "learning-rate schedule over the run: constant; cosine decay "
    "to 0 by the last step; restarts: a cosine cycle every 2 epochs (SGDR); auto: "
    "restarts for more than 2 epochs beside an ftrl wide part on more than 50000 "
    "training rows, where the hold-out restores an early epoch, else cosine",
    "weight-decay": "decoupled weight decay (AdamW) of every model; 0: plain Adam",
    "model": "dlrm: each node sends one vector per categorical column and one "
    "for its numeric columns, the label party's top model takes their pairwise "
    "dot products (learns interactions between nodes' columns); mlp: each node "
    "sends one MLP output, the top model is an MLP; auto: dlrm when the dataset "
    "has categorical columns, else mlp",
    "wide": "a wide (linear) part: each node's per-category weights and "
    "numeric weights, summed into the logit by the label party; auto: on, "
    "trained by ftrl, for criteo/avazu files of at most 200000 training rows "
    "(where it was measured to win), off otherwise; on/off (true/false) decide",
    "wide-optimizer": "optimizer of the wide part: adam (the run's Adam(W), with "
    "the deep part) or ftrl (FTRL-proximal with its own rate and L1/L2); auto: "
    "ftrl where wide = auto turned the wide part on, else adam",
    "wide-lr": "ftrl: alpha, the wide part's per-coordinate rate is "
    "alpha / (1 + sqrt(sum of squared gradients))",
    "wide-l1": "ftrl: L1 penalty of the wide weights (a weight stays exactly 0 "
    "until its summed gradient exceeds it)",
    "wide-l2": "ftrl: L2 penalty of the wide weights, in units of their summed "
    "gradients (on at most 50000 training rows with noisy labels, more than 2 "
    "epochs take wide-lr times 2 / epochs and wide-l1, wide-l2 times epochs / 2)",
    "validation-fraction": "probability of a training record being held out "
    "for validation (by id alone); each epoch is scored on its noisy labels and "
    "the best epoch's models are restored at the end; 0: no validation; auto: "
    "0.1 for runs of 3 or more epochs on a criteo or avazu file where that holds "
    "out at least 2000 ids, else 0 (and 0 for gaussian; the built-in tables "
    "return the tail average instead)",
    "average": "return every party's weights averaged over every epoch after the "
    "first (each party its own: the top model, each bottom model); auto: on for "
    "runs of 5 or more epochs without a validation hold-out, unless the labels "
    "are heavily noisy and the epoch budget leaves under 64 steps an epoch (the "
    "model still learns at the end, e.g. 2000-row criteo/avazu files); a resume "
    "keeps the "
    "stopped run's resolved value (another is refused)",
    "denoise": "what the label party trains on: the mechanism's noisy labels "
    "(none, the paper), or their posterior given a prior (posterior; "
    "post-processing, same epsilon); auto: posterior for laplace and "
    "discrete with 2 classes, or more classes where randomized response keeps "
    "under half the labels, none otherwise",
    "denoise-prior": "prior of denoise=posterior: the current top model's "
    "prediction (model) or class frequencies estimated from the noisy labels "
    "(frequency)",
    "steps-per-message": "training steps batched into one message per node",
    "pipeline-depth": "train messages sent ahead of the replies, per node: d > 0 "
    "keeps a node's queue non-empty (no 3 s idle pull on a Flower deployment) but "
    "its bottom model embeds d steps stale; 0: sequential split learning; refused "
    "on Ray simulation",
    "wire-dtype": "float dtype of embeddings and perturbed gradients on the wire: "
    "float16 halves each message's bytes (scaled by a power of two, cast after "
    "perturbation: same epsilon); float32: as computed",
    "party-actors": "Ray simulation only: each node's party lives in one Ray actor "
    "for the run and only messages cross; false: its state (~41 MB a message for "
    "a Criteo node) travels with every message",
    "num-parties": "non-label parties (Flower nodes), each holding a column slice",
    "embedding-dim": "width of each vector a node sends: each field vector "
    "(dlrm) or the node's whole cut layer (mlp)",
    "bottom-hidden": "hidden width of each non-label party's bottom model",
    "top-hidden": "hidden width of the label party's top model",
    "seed": "seed of the data split, the model weights and the batch order",
    "noise-seed": "label party only, never run config: derive the noise key from "
    "this seed (reproducible, NOT secure); -1: a key from the OS",
    "new-release": "label party only, never run config: acknowledge that this run "
    "is a further release of labels the privacy ledger already holds (their total "
    "epsilon grows); without it such a run is refused",
    "privacy-budget": "label party only, never run config: refuse a release that "
    "takes the label set's total epsilon (over every release in the ledger) above "
    "this; 0: no budget",
    "release": "label party only, never run config: count this run as a release "
    "in the privacy ledger even on an engine whose nodes the label party starts "
    "itself (their outputs will be shared, say)",
    "unprotected-release": "label party only, never run config: allow a release "
    "with mechanism none (every label readable by the nodes); without it such a "
    "release is refused",
    "out-dir": "folder of results.json, report.md and the nodes' checkpoints",
    "label-dir": "the label party's private folder (key, checkpoints); "
    "empty: OUT-DIR/label-party",
    "checkpoint": "checkpoint every party after each epoch (needed by resume)",
    "audit": "attack the dispatched transcript every epoch (norm, cosine, "
    "spectral, SDA AUCs in the results)",
    "transcript-dir": "every non-label node records what it receives into this "
    "folder (for tpsl-flwr attack); empty: no recording",
    "resume": "continue from the last epoch checkpoint in out-dir",
    "reply-timeout": "seconds the label party waits for every node's reply to a "
    "message; a node silent that long stops the run with an error naming it",
}
"""One line of help per field (kebab-case key): the ``tpsl-flwr simulate`` flags.

Every field of :class:`ExperimentConfig` has an entry, so adding a field adds a
documented flag (:mod:`tpsl_flwr.cli.flags`).
"""
FIELD_CHOICES: dict[str, tuple[str, ...]] = {
    "dataset": ALL_DATASETS,
    "split": SPLITS,
    "mechanism": MECHANISMS,
    "placement": PLACEMENTS,
    "lr-schedule": LR_SCHEDULES,
    "denoise": DENOISERS,
    "denoise-prior": DENOISE_PRIORS,
    "model": MODELS,
    "wide": WIDE_MODES,
    "average": AVERAGE_MODES,
    "wide-optimizer": WIDE_OPTIMIZERS,
    "wire-dtype": WIRE_DTYPES,
}
"""The valid values of the fields that name one of a fixed set."""


def coerce_value(key: str, raw: Any, kind: object) -> Any:
    """A run-config value as its field's type (``kind``: the annotation).

    TOML and ``--run-config`` give booleans, integers and floats as text or as
    numbers; a float that is not a whole number is not an ``int``.

    Raises
    ------
    ConfigError
        Naming ``key``, the type and the value.

    Examples
    --------
    >>> coerce_value("epochs", 3.0, "int"), coerce_value("audit", "false", "bool")
    (3, False)
    """
    kind_name = kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))
    try:
        if kind_name == "bool":
            return parse_bool(raw)
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
