"""The strategy held to its release: the same key, settings, spend and hold-out.

Before any step (the strategy's constructor, and ``start`` again after its
``num_rounds``), :func:`check_release` refuses a strategy that would train
otherwise than the ledger recorded when its release was opened
(:meth:`~tpsl_flwr.release.store.LabelStore.open_release`).
"""

from __future__ import annotations

from flwr.app import ConfigRecord

from tpsl_flwr.errors import ConfigError, PrivacyError
from tpsl_flwr.parties import LabelParty
from tpsl_flwr.privacy.accounting import PrivacySpent
from tpsl_flwr.release.binding import check_bound
from tpsl_flwr.release.record import check_spend
from tpsl_flwr.release.store import Release

__all__ = ["check_release", "refuse_configs"]


def check_release(
    release: Release,
    *,
    party: LabelParty,
    privacy: PrivacySpent,
    epochs: int,
    held_out: float,
) -> None:
    """Refuse a strategy that would train otherwise than its release says.

    The release's key is the label party's, the party states the release's
    mechanism, parameter, placement and noise reuse
    (:func:`~tpsl_flwr.release.binding.check_bound`), the strategy spends no
    more releases per label (``privacy``, over ``epochs``) than the ledger
    recorded, and holds out the validation fraction (``held_out``) the release
    was bound to.

    Raises
    ------
    PrivacyError
        Naming what differs.
    """
    if release.key != party.key:
        raise PrivacyError(
            f"the release's key ({release.key.fingerprint}) is not the label "
            f"party's ({party.key.fingerprint})"
        )
    check_bound(
        party.key,
        release.binding,
        mechanism=party.mechanism,
        placement=party.placement,
        reuse_noise=party.reuse_noise,
        user="TPSLStrategy",
    )
    check_spend(release.ledger, privacy)
    opened = release.privacy
    if opened is not None and privacy.releases > opened.releases:
        raise PrivacyError(
            f"TPSLStrategy spends {privacy.releases} release(s) per label "
            f"({epochs} epochs) but its release was opened for "
            f"{opened.releases} ({opened.epochs} epochs): state the release's epochs"
        )
    bound = None if release.binding is None else release.binding.settings
    if (
        bound is not None
        and "validation-fraction" in bound
        and (float(bound["validation-fraction"]) != held_out)
    ):
        raise PrivacyError(
            f"TPSLStrategy holds out validation-fraction {held_out} but its "
            f"release was bound to {bound['validation-fraction']}: ids whose "
            "noisy labels were released for validation would be trained on (or "
            "the reverse); state the release's value"
        )


def refuse_configs(**given: ConfigRecord | None) -> None:
    """Refuse non-empty configs ``start`` was given: it sends only its own keys."""
    for name, config in given.items():
        if config:
            raise ConfigError(
                f"TPSLStrategy.start does not send {name} ({sorted(config)}): "
                "only the protocol's keys may leave the label party"
            )
