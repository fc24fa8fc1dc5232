"""What fixes a release's noise: the settings, the id space and the labels.

A noise key is bound to a :class:`NoiseBinding` (Yang et al., Section 6: each
sample's noise is drawn once and reused, so a key serves exactly one release).
Two runs may share a key only if their bindings and labels are equal; every
fresh run's key is derived from both (:meth:`NoiseBinding.context`), so two
settings never share noise words. :class:`LabelRecords` are the labels the
label party holds for a run, identified by content in the privacy ledger.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tpsl_flwr.errors import PrivacyError
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms import Mechanism

__all__ = ["NOT_NOISE", "LabelRecords", "NoiseBinding", "check_bound"]

NOT_NOISE = frozenset({"validation-fraction"})
"""Bound settings that a resume must keep but that fix no noise word.

Which ids are held out for validation: a held-out id's noisy label is drawn
on the transcript stream of epoch 0, the draw training gives it in its first
epoch (with or without ``reuse-noise``), so two runs that differ only here
release the same noisy labels.
"""


@dataclass(frozen=True)
class NoiseBinding:
    """Every setting that fixes the noise a key releases, by kebab-case name.

    Two runs may share a key only if their bindings are equal: then every
    sample id names the same record and gets the same noise.

    Examples
    --------
    >>> from tpsl_flwr.privacy.mechanisms import make_mechanism
    >>> a = NoiseBinding.of(
    ...     mechanism=make_mechanism("laplace", epsilon=1.0),
    ...     placement="logits",
    ...     reuse_noise=True,
    ...     id_space={"dataset": "digits", "id-space": "ab12"},
    ... )
    >>> b = NoiseBinding.of(
    ...     mechanism=make_mechanism("laplace", epsilon=4.0),
    ...     placement="logits",
    ...     reuse_noise=True,
    ...     id_space={"dataset": "digits", "id-space": "ab12"},
    ... )
    >>> a.changes(b)
    ['epsilon (1.0 -> 4.0)']
    """

    settings: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        *,
        mechanism: Mechanism,
        placement: str,
        reuse_noise: bool,
        id_space: Mapping[str, Any],
    ) -> NoiseBinding:
        """The binding of a mechanism, its placement and an id space."""
        settings: dict[str, Any] = {
            "mechanism": mechanism.name,
            "epsilon": None,
            "sigma": None,
            "num-classes": mechanism.num_classes,
            "placement": placement,
            "reuse-noise": bool(reuse_noise),
        }
        if mechanism.parameter is not None:
            settings[mechanism.parameter] = mechanism.parameter_value
        settings.update(id_space)
        return cls(settings)

    def changes(self, other: NoiseBinding) -> list[str]:
        """The settings that differ, as ``"name (old -> new)"``, in a fixed order."""
        old, new = self.settings, other.settings
        names = list(old) + [n for n in new if n not in old]
        return [
            f"{name} ({old.get(name)!r} -> {new.get(name)!r})"
            for name in names
            if old.get(name) != new.get(name)
        ]

    def mismatches(self, other: NoiseBinding) -> list[str]:
        """:meth:`changes` over the settings ``other`` states (``other``'s subset).

        Examples
        --------
        >>> NoiseBinding({"epsilon": 1.0, "rows": 9}).mismatches(
        ...     NoiseBinding({"epsilon": 4.0}))
        ['epsilon (1.0 -> 4.0)']
        """
        mine = NoiseBinding({k: self.settings.get(k) for k in other.settings})
        return mine.changes(other)

    def context(self, label_check: bytes) -> bytes:
        """The bytes a release key is derived from: the settings and the labels.

        Everything in the binding but :data:`NOT_NOISE` (settings that a resume
        must keep, but that do not change which noise a record gets), then the
        keyed digest of the labels.
        """
        noise = {k: v for k, v in self.settings.items() if k not in NOT_NOISE}
        text = json.dumps(noise, sort_keys=True, default=str)
        return text.encode() + b"\x00" + label_check


def check_bound(
    key: NoiseKey,
    binding: NoiseBinding | None,
    *,
    mechanism: Mechanism,
    placement: str,
    reuse_noise: bool,
    user: str,
) -> None:
    """Refuse to use ``key`` (or a release's ``binding``) at other settings.

    A key serves one release (its binding): the same key at another epsilon
    gives correlated draws of the same noise words (Laplace at ``eps = 1``
    and ``4`` under one key: ``(4 c_4 - c_1) / 3`` recovers every label), so
    whatever trains with a bound key states the same mechanism, parameter,
    classes, placement and noise reuse, or nothing runs.

    Raises
    ------
    PrivacyError
        Naming each setting that differs (bound -> stated) and ``user``.
    """
    stated = NoiseBinding.of(
        mechanism=mechanism, placement=placement, reuse_noise=reuse_noise, id_space={}
    )
    bound = [b for b in (binding,) if b is not None]
    if key.binding is not None:
        bound.append(NoiseBinding(dict(key.binding)))
    for release in bound:
        changed = release.mismatches(stated)
        if changed:
            raise PrivacyError(
                f"{user} states other settings than its release (key "
                f"{key.fingerprint}): {', '.join(changed)} (release -> stated). "
                "One key serves one release: the same key at other settings "
                "releases correlated draws of the same noise; open a release for "
                "these settings and use its key"
            )


@dataclass(frozen=True)
class LabelRecords:
    """Every label the label party holds for a run, with its record ids.

    Train, validation and test labels together: a run over another split of
    the same table releases labels of the same set. Record ids must be stable
    ids of the records (a row limit keeps the first ones), never wire
    positions that change with the split.
    """

    ids: np.ndarray
    labels: np.ndarray

    @classmethod
    def of_splits(
        cls,
        train_ids: np.ndarray,
        train_labels: np.ndarray,
        test_ids: np.ndarray,
        test_labels: np.ndarray,
    ) -> LabelRecords:
        """Train and test records merged in increasing id order.

        Both splits' ids are increasing (the views'); merging by binary search
        spares the label set's fingerprint a sort of every record (its index
        alone is 8 bytes a row). Ids and labels keep their dtypes.

        Examples
        --------
        >>> r = LabelRecords.of_splits(
        ...     np.array([0, 3]), np.array([1, 0]), np.array([1, 2]), np.array([0, 1]))
        >>> r.ids.tolist(), r.labels.tolist()
        ([0, 1, 2, 3], [1, 0, 1, 0])
        """
        n = train_ids.size + test_ids.size
        at_test = np.zeros(n, dtype=bool)
        at_test[np.searchsorted(train_ids, test_ids) + np.arange(test_ids.size)] = True
        ids = np.empty(n, dtype=np.result_type(train_ids, test_ids))
        labels = np.empty(n, dtype=np.result_type(train_labels, test_labels))
        ids[~at_test], ids[at_test] = train_ids, test_ids
        labels[~at_test], labels[at_test] = train_labels, test_labels
        return cls(ids, labels)
