"""The label party in one call: :meth:`TPSLStrategy.for_labels`.

An embedder's ServerApp needs a mechanism, a noise binding, the label party's
store, a release recorded in the privacy ledger, the accounting, a
:class:`~tpsl_flwr.parties.LabelParty` and a
:class:`~tpsl_flwr.strategies.TPSLStrategy`, built in that order and stating
the same settings each time. :func:`for_labels` builds all of them from one
statement of each setting, as Flower's ``FedAvg(fraction_train=...)`` or
Opacus's ``make_private(...)`` do, and checks every argument before it opens
the release, so that an inconsistent statement is refused with nothing
written and before any node is contacted. Settings left out take the values
``tpsl-flwr simulate`` resolves them to (:mod:`~tpsl_flwr.experiments.config`).
The lower-level objects stay public for those who need them
(``docs/embedding.md``, "The lower-level path").
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from logging import INFO
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from flwr.common.logger import log
from torch import nn

from tpsl_flwr._util.checks import (
    check_int,
    check_num_classes,
    check_placement,
    check_positive_finite,
)
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.parties import LabelParty, adam
from tpsl_flwr.parties.optim import OptimizerFactory, lr_scale
from tpsl_flwr.parties.training_rules import heavy_label_noise, resolve_training
from tpsl_flwr.parties.weight_average import resolve_average
from tpsl_flwr.privacy.accounting import privacy_spent
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.release.ledger import PrivacyLedger
from tpsl_flwr.release.store import LabelRecords, LabelStore, NoiseBinding, Release
from tpsl_flwr.strategies.exchange import MAX_INTERVAL
from tpsl_flwr.strategies.label_settings import (
    DEFAULT_WEIGHT_DECAY,
    RECORD_IDS,
    check_release_options,
    checked_labels,
    checked_record_ids,
    denoise_of,
    id_space_of,
    ids_digest,
    mechanism_of,
    optimizer_of,
)
from tpsl_flwr.validation.holdout import resolve_validation
from tpsl_flwr.validation.scores import check_validation_mechanism
from tpsl_flwr.wire.wire_dtype import check_wire_dtype

Strategy = TypeVar("Strategy")
"""The strategy class ``for_labels`` is bound to (``TPSLStrategy``)."""
EpochCallback = Callable[[int, dict[str, Any]], None]

__all__ = ["for_labels"]


def for_labels(
    cls: Callable[..., Strategy],
    top: nn.Module,
    *,
    train_labels: Any,
    record_ids: Any,
    label_dir: str | Path,
    test_labels: Any = None,
    num_classes: int = 2,
    mechanism: str = "laplace",
    epsilon: float | None = None,
    sigma: float | None = None,
    marvell_power: float | None = None,
    placement: str = "logits",
    reuse_noise: bool = True,
    epochs: int = 2,
    batch_size: int = 0,
    lr: float = 0.0,
    weight_decay: float | None = None,
    optimizer: OptimizerFactory | None = None,
    lr_schedule: str = "cosine",
    validation_fraction: float | str = "auto",
    average: str | bool = "auto",
    denoise: str = "auto",
    denoise_prior: str = "model",
    steps_per_message: int = 1,
    pipeline_depth: int = 0,
    wire_dtype: str = "float32",
    order_seed: int = 0,
    num_nodes: int | None = None,
    id_space: Mapping[str, str | int | float | bool] | None = None,
    resume: bool = False,
    new_release: bool = False,
    rehearsal: bool = False,
    budget: float | None = None,
    unprotected_release: bool = False,
    public_labels: bool = False,
    noise_key: NoiseKey | None = None,
    run_name: str = "",
    ledger: PrivacyLedger | None = None,
    audit: bool = False,
    node_wait: float = 60.0,
    poll_interval: float = MAX_INTERVAL,
    on_epoch_end: EpochCallback | None = None,
) -> Strategy:
    """The label party of an embedded app, in one call, every setting stated once.

    Builds the mechanism, the noise binding, the label party's
    :class:`~tpsl_flwr.label_store.LabelStore`, the release (recorded in the
    privacy ledger before this returns, so before any gradient leaves), the
    accounting, the :class:`~tpsl_flwr.parties.LabelParty` and the strategy,
    with ``store=`` and ``release=``: it checkpoints after every epoch and
    can resume. Every argument is checked first, the bad value named in a
    :class:`~tpsl_flwr.errors.ConfigError`; an inconsistent combination is
    refused before the release is opened, so nothing is written then.

    Parameters
    ----------
    top
        The top model: ``(n, sum of the nodes' widths) -> (n, 1)`` for binary
        labels, ``(n, k)`` for ``k`` classes.
    train_labels
        Integer labels ``0..num_classes-1``; ``train_labels[i]`` is training
        sample ``i``'s (every node's train split has these rows).
    record_ids
        The stable record id of every label, train then test:
        ``record_ids[i]`` is ``train_labels[i]``'s, ``record_ids[n_train + j]``
        is ``test_labels[j]``'s. Distinct integers ``>= 0``. They identify the
        labels in the privacy ledger and, with the split sizes, fix the id
        space of the noise binding (a digest of them is bound).
    label_dir
        The label party's private folder (noise key, checkpoints; mode
        ``0700``). Never a folder the nodes write to.
    test_labels
        Test labels (ids ``0..n_test-1`` at every node), evaluated at the
        label party; ``None``: no evaluation.
    num_classes
        ``k``, the number of classes (2: one logit, sigmoid + BCE).
    mechanism
        ``laplace`` (default), ``discrete`` (randomized response),
        ``gaussian`` (the baseline), ``none`` (no protection), or the
        baseline defenses ``marvell``, ``max-norm`` (no DP guarantee) and
        ``rr-prior`` (``docs/baselines.md``).
    epsilon
        The pure epsilon of ``laplace``, ``discrete`` and ``rr-prior``
        (default 1.0). Refused for the others, which take none.
    sigma
        The noise deviation of ``gaussian`` (default 1.0); refused for the
        others.
    marvell_power
        The scale ``s`` of ``marvell``'s power constraint (default 1.0);
        refused for the others.
    placement
        ``logits`` (``epsilon`` per label) or ``cut`` (``2 epsilon``).
    reuse_noise
        Draw each sample's noise once and reuse it every epoch (the paper's
        rule: the spend does not grow with the epochs).
    epochs
        Passes over the training ids.
    batch_size
        Samples per step; 0 (default): as ``simulate`` resolves it from the
        training rows (:func:`~tpsl_flwr.parties.training_rules.resolve_training`).
    lr
        The top model's Adam(W) rate; 0 (default): resolved as ``batch_size``.
        The nodes' optimizers are their own: give them the same rate
        (``resolve_training(train_rows=n, epochs=e, heavy_noise=h).lr`` where
        it is auto, ``h = heavy_label_noise(mechanism, classes=k,
        epsilon=epsilon)``: on at most 50,000 rows a run of more than two
        epochs under such noise keeps two epochs' worth of steps).
    weight_decay
        AdamW's decoupled weight decay (default 0.3; 0: Adam).
    optimizer
        A factory ``params -> torch optimizer`` instead of Adam(W) at
        ``lr`` and ``weight_decay``; refused beside either of them.
    lr_schedule
        ``cosine`` (default), ``constant`` or ``restarts`` (a cosine cycle
        every 2 epochs, which ``simulate`` takes for more than 2 epochs beside
        an FTRL wide part on more than 50,000 rows:
        :func:`~tpsl_flwr.parties.training_rules.resolve_schedule`); the nodes
        follow the scale each message carries.
    validation_fraction
        Held-out fraction of the training ids, or ``auto`` (default: 0.1 from
        3 epochs and 2000 held-out ids on, else 0); refused above 0 for
        ``gaussian``.
    average
        ``auto`` (default), ``on`` or ``off``: return every party's weights
        averaged over the later epochs, each party its own (the top model
        here, each node its bottom model, on the label party's word); ``auto``
        is on for runs of 5 or more epochs without a hold-out, except where
        the epoch budget leaves the model still learning at the end (heavy
        label noise and fewer than 64 steps an epoch on small data;
        :func:`~tpsl_flwr.parties.weight_average.resolve_average`); ``on``
        beside a hold-out is refused.
    denoise
        ``auto`` (default), ``posterior`` or ``none``: what the top model
        trains on (:func:`~tpsl_flwr.parties.training_rules.resolve_denoise`).
    denoise_prior
        ``model`` (default) or ``frequency``.
    steps_per_message
        ``K`` batches per message: fewer round trips, bottom models up to
        ``K - 1`` steps stale. Use a larger ``K`` on a deployment, where a
        message costs seconds.
    pipeline_depth
        ``d``: messages pushed before the last reply is back (0: exact).
    wire_dtype
        ``float32`` (default) or ``float16`` for the gradients sent.
    order_seed
        Seed of the per-epoch batch order (public, label-independent).
    num_nodes
        Non-label nodes to wait for (``None``: those present at start).
    id_space
        Extra names of the id space (``{"table": "customers-2026-11"}``):
        whatever else decides which record an id names. Plain values; the
        settings' own names (:data:`RESERVED`) are refused.
    resume
        Continue the run bound in ``label_dir`` (same settings and labels,
        else refused, naming what changed): the finished epochs are
        restored, the nodes load their checkpoints, and the strategy logs
        ``resuming after epoch N``. Every check (the ledger's, the bound
        settings, the optimizer's rates: ``ResumeRefused``) is decided first
        on a dry run of the release, building the strategy once more (the
        class's constructor and ``optimizer`` run twice), so that a refused
        resume writes nothing.
    new_release
        Acknowledge a further release of labels the ledger already holds
        under another key (a fresh run only).
    rehearsal
        Every node of this run is the label party's own (a local test
        deployment): recorded, never counted or refused. Default: a release.
    budget
        Refuse a fresh release that would take the labels' total pure
        epsilon above this.
    unprotected_release
        Allow a release with ``mechanism = "none"``, ``"marvell"`` or
        ``"max-norm"`` (no DP guarantee: refused otherwise by the ledger);
        refused beside a mechanism with a DP guarantee.
    public_labels
        Rehearsal data whose labels are public anyway: recorded, never
        refused. Never for your users' labels.
    noise_key
        The key a fresh release's key is derived from, e.g.
        ``NoiseKey.from_seed(0)`` for a reproducible test (NOT secure);
        default: a fresh key from the OS. Refused on resume.
    run_name
        Recorded with the release, for people reading the ledger.
    ledger
        The privacy ledger (default: ``$TPSL_FLWR_LEDGER_DIR``, else
        ``~/.local/share/tpsl-flwr/ledger``); tests pass their own.
    audit
        Attack the dispatched transcript every epoch (costly).
    node_wait
        Seconds to wait for the nodes to register.
    poll_interval
        Longest sleep between two pulls for replies.
    on_epoch_end
        Called with ``(epoch, history entry)`` after each epoch.

    Returns
    -------
    TPSLStrategy
        Ready for ``strategy.start(grid=grid)``; ``strategy.release`` is its
        release (``release.ledger.total``: the labels' composed spend).

    Raises
    ------
    ConfigError
        For a bad value or an inconsistent combination, naming it; nothing
        written.
    PrivacyError
        From the store: a resume with changed settings or labels, or without
        a bound key; :class:`~tpsl_flwr.errors.ReleaseRefused` for a release
        the ledger refuses (nothing written).

    Examples
    --------
    >>> import tempfile
    >>> from tpsl_flwr import TPSLStrategy
    >>> from tpsl_flwr.ledger import PrivacyLedger
    >>> folder = Path(tempfile.mkdtemp())
    >>> labels = np.arange(40) % 2
    >>> strategy = TPSLStrategy.for_labels(
    ...     nn.Linear(6, 1),
    ...     train_labels=labels[:32],
    ...     test_labels=labels[32:],
    ...     record_ids=np.arange(40),
    ...     mechanism="laplace",
    ...     epsilon=1.0,
    ...     epochs=3,
    ...     label_dir=folder / "label-party",
    ...     ledger=PrivacyLedger(folder / "ledger"),  # tests only
    ... )
    >>> strategy.privacy.epsilon, strategy.batch_size, strategy.release.kind
    (1.0, 32, 'release')
    >>> TPSLStrategy.for_labels(  # doctest: +ELLIPSIS
    ...     nn.Linear(6, 1), train_labels=labels, record_ids=np.arange(40),
    ...     mechanism="gaussian", epsilon=1.0, label_dir=folder / "other",
    ... )
    Traceback (most recent call last):
    ...
    tpsl_flwr.errors.ConfigError: mechanism 'gaussian' takes sigma, not epsilon (got epsilon=1.0); ...
    """  # noqa: E501
    # ------------------------------------------------ every argument, first
    if not isinstance(top, nn.Module):
        raise ConfigError(f"top must be a torch nn.Module, got {type(top).__name__}")
    flags = {
        "reuse_noise": reuse_noise,
        "resume": resume,
        "new_release": new_release,
        "rehearsal": rehearsal,
        "unprotected_release": unprotected_release,
        "public_labels": public_labels,
        "audit": audit,
    }
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be True or False, got {value!r}")
    k = check_num_classes(num_classes)
    mech = mechanism_of(
        mechanism,
        epsilon=epsilon,
        sigma=sigma,
        marvell_power=marvell_power,
        num_classes=k,
    )
    train, test = checked_labels(train_labels, test_labels, k)
    ids = checked_record_ids(record_ids, train.size, 0 if test is None else test.size)
    check_placement(placement)
    check_int(epochs, "epochs")
    check_int(batch_size, "batch_size", minimum=0)
    factory = optimizer_of(optimizer, lr, weight_decay)
    lr_scale(lr_schedule, 0, 1)  # refuses an unknown schedule
    check_int(steps_per_message, "steps_per_message")
    check_int(pipeline_depth, "pipeline_depth", minimum=0)
    check_wire_dtype(wire_dtype)
    check_int(order_seed, "order_seed", minimum=0)
    if num_nodes is not None:
        check_int(num_nodes, "num_nodes")
    check_positive_finite(node_wait, "node_wait")
    check_positive_finite(poll_interval, "poll_interval")
    if on_epoch_end is not None and not callable(on_epoch_end):
        raise ConfigError(f"on_epoch_end must be callable, got {on_epoch_end!r}")
    if not isinstance(run_name, str):
        raise ConfigError(f"run_name must be text, got {run_name!r}")
    if not isinstance(label_dir, str | Path) or not str(label_dir):
        raise ConfigError(f"label_dir must be a folder path, got {label_dir!r}")
    if ledger is not None and not isinstance(ledger, PrivacyLedger):
        raise ConfigError(f"ledger must be a PrivacyLedger, got {ledger!r}")
    check_release_options(
        mech,
        resume=resume,
        new_release=new_release,
        budget=budget,
        noise_key=noise_key,
        unprotected_release=unprotected_release,
    )
    # ----------------------------------------- auto resolved, as simulate does
    heavy = heavy_label_noise(mech.name, classes=k, epsilon=mech.epsilon or 0.0)
    training = resolve_training(
        train_rows=int(train.size),
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        heavy_noise=heavy,
    )
    fraction = resolve_validation(
        validation_fraction,
        train_rows=int(train.size),
        epochs=epochs,
        mechanism=mech.name,
    )
    if fraction > 0:
        check_validation_mechanism(mech)
    resolve_average(average, epochs=epochs, held_out=fraction > 0)  # refused now
    if average == "auto" and training.still_learning and optimizer is None:
        average = "off"  # as simulate resolves it (the budget sets the rate)
    denoised = denoise_of(denoise, denoise_prior, mech)
    if factory is None:
        decay = DEFAULT_WEIGHT_DECAY if weight_decay is None else weight_decay
        factory = adam(training.lr, decay)
    space = {
        **id_space_of(id_space),
        RECORD_IDS: ids_digest(ids, int(train.size)),
        # Which ids are held out: a changed hold-out would train on labels
        # already released for validation (and vice versa).
        "validation-fraction": fraction,
    }
    binding = NoiseBinding.of(
        mechanism=mech, placement=placement, reuse_noise=reuse_noise, id_space=space
    )
    privacy = privacy_spent(
        mechanism=mech, placement=placement, epochs=epochs, reuse_noise=reuse_noise
    )
    everything = np.concatenate([train, test]) if test is not None else train
    records = LabelRecords(ids, everything)
    # -------------------------------------------- the release, in the ledger
    store = LabelStore(label_dir)
    request: dict[str, Any] = dict(
        resume=resume,
        labels=records,
        privacy=privacy,
        public_labels=public_labels,
        new_release=new_release,
        budget=budget,
        ledger=ledger,
        run_name=run_name,
        rehearsal=rehearsal,
        unprotected_release=unprotected_release,
    )

    def strategy_on(release: Release, model: nn.Module) -> Any:
        party = LabelParty(
            model,
            train,
            mech,
            release.key,
            placement=placement,
            optimizer=factory,
            reuse_noise=reuse_noise,
            denoise=denoised,
            denoise_prior=denoise_prior,
        )
        strategy = cls(
            party,
            test_labels=test,
            batch_size=training.batch_size,
            epochs=epochs,
            steps_per_message=steps_per_message,
            order_seed=order_seed,
            num_nodes=num_nodes,
            on_epoch_end=on_epoch_end,
            node_wait=node_wait,
            audit=audit,
            poll_interval=poll_interval,
            store=store,
            release=release,
            validation_fraction=fraction,
            lr_schedule=lr_schedule,
            pipeline_depth=pipeline_depth,
            wire_dtype=wire_dtype,
            average=average,
        )
        return strategy

    if noise_key is not None or resume:
        # Decide first, writing nothing, so that a refused release leaves the
        # folder's key (and a run it could resume) as it was, and a refused
        # resume (its settings: resume_check) records nothing in the ledger.
        dry = store.open_release(binding, dry_run=True, **request)
        if resume:
            strategy_on(dry, copy.deepcopy(top))
    if noise_key is not None:
        store.provide_key(noise_key, origin="os" if noise_key.secure else "seed")
    release = store.open_release(binding, **request)
    try:
        strategy = strategy_on(release, top)
    except BaseException:
        if not release.resumed:
            store.void(release)  # refused before a gradient was made
        raise
    log(
        INFO,
        "TPSLStrategy.for_labels: %s %s of %d training labels (key %s): batch "
        "size %d, lr %s, validation-fraction %s, denoise %s",
        "resumed" if release.resumed else "a fresh",
        release.kind,
        train.size,
        release.key.fingerprint,
        training.batch_size,
        "(optimizer given)" if optimizer is not None else f"{training.lr:g}",
        fraction,
        denoised,
    )
    return strategy
