"""The label party's own folder: its noise key, bound to one release, and checkpoints.

TPSL's guarantee holds for one *release*: every sample's noise is drawn once
from the secret key and reused (Yang et al., Section 6). Two releases under the
same key at different settings are correlated draws of the same words: with
Laplace noise at ``eps = 1`` and then ``eps = 4``, ``t1 - 2 t2 = -y`` recovers
every label. So the key is stored together with its *binding*: every setting
that fixes the noise (mechanism, epsilon or sigma, classes, placement, noise
reuse) and the id space (which record each sample id names). A run that
resumes must present the same binding, or it is refused with the changed
settings named; a run that starts afresh draws a new key.

Layout of the folder (``0700``; every file ``0600``, see
:mod:`tpsl_flwr.private_files`):

* ``noise-key.json``: the key (hex), whether it is secure (from the OS) or
  seeded, and its binding once a run has used it. JSON, so loading it runs no
  code. A key written by :meth:`LabelStore.provide_key` (``tpsl-flwr keygen``,
  ``simulate --noise-seed``) is unbound until the next fresh run takes it.
* ``checkpoint.pt``: the last finished epoch, the party's tensors and the
  history (as JSON text), read with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tpsl_flwr.errors import ConfigError, PrivacyError
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms import Mechanism
from tpsl_flwr.private_files import make_private_dir, read_private, write_private

__all__ = ["LabelStore", "NoiseBinding", "Release"]

KEY_FILE = "noise-key.json"
CHECKPOINT_FILE = "checkpoint.pt"
KEY_FORMAT = "tpsl-flwr noise key 1"
ORIGINS = ("os", "seed")


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


@dataclass
class Release:
    """What a run of the label party starts from.

    Attributes
    ----------
    key
        The noise key of the release.
    origin
        ``"os"`` (secure) or ``"seed"`` (reproducible, NOT secure against anyone
        who knows the seed).
    start_epoch
        First epoch to run (0 for a fresh run).
    history
        Per-epoch history of the epochs already run.
    party_state
        :meth:`~tpsl_flwr.parties.LabelParty.state_dict` to restore, or None.
    """

    key: NoiseKey
    origin: str
    start_epoch: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    party_state: dict[str, Any] | None = None


class LabelStore:
    """The label party's private folder (see the module docstring).

    Parameters
    ----------
    folder
        The folder; created with mode ``0700`` on first write. It must not be
        a folder the non-label parties write to.
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    @property
    def key_path(self) -> Path:
        """Where the key and its binding are kept."""
        return self.folder / KEY_FILE

    @property
    def checkpoint_path(self) -> Path:
        """Where the last finished epoch's state is kept."""
        return self.folder / CHECKPOINT_FILE

    # ------------------------------------------------------------------ keys
    def provide_key(self, key: NoiseKey, origin: str) -> None:
        """Leave an unbound key for the next fresh run (``keygen``, a seed).

        Raises
        ------
        ConfigError
            If ``origin`` is not ``"os"`` or ``"seed"``, or disagrees with
            ``key.secure``.
        """
        if origin not in ORIGINS or (origin == "os") != key.secure:
            raise ConfigError(
                f"origin must be 'os' for a secure key or 'seed' for a seeded one, "
                f"got {origin!r} for secure={key.secure}"
            )
        make_private_dir(self.folder)
        self._write_key(key, origin, None)

    def open_release(self, binding: NoiseBinding, *, resume: bool) -> Release:
        """The key (and saved state) a run with ``binding`` may use.

        A fresh run takes an unbound key left by :meth:`provide_key`, else
        draws one from the OS; it binds the key and drops any older checkpoint.
        A resumed run needs this folder's bound key and checkpoint, and the
        same binding.

        Raises
        ------
        PrivacyError
            On resume without a key or checkpoint, or with a changed binding
            (the changed settings are named), or if a file is not private.
        """
        make_private_dir(self.folder)
        if resume:
            return self._resume(binding)
        saved = self._read_key() if self.key_path.exists() else None
        if saved is not None and saved[2] is None:
            key, origin = saved[0], saved[1]
        else:
            key, origin = NoiseKey.from_os(), "os"
        self.checkpoint_path.unlink(missing_ok=True)
        self._write_key(key, origin, binding)
        return Release(key, origin)

    def _resume(self, binding: NoiseBinding) -> Release:
        if not self.key_path.exists() or not self.checkpoint_path.exists():
            raise PrivacyError(
                f"cannot resume: no label-party checkpoint in {self.folder} (a new "
                "key would make a second release reported as one); start a new run"
            )
        key, origin, bound = self._read_key()
        if bound is None:
            raise PrivacyError(
                f"cannot resume: the key in {self.key_path} was never used by a run"
            )
        changed = bound.changes(binding)
        if changed:
            raise PrivacyError(
                "cannot resume: changed since the checkpoint: "
                + ", ".join(changed)
                + f". The same key (fingerprint {key.fingerprint}) would release a "
                "second, correlated draw for the same labels; start a new run instead"
            )
        state = torch.load(
            io.BytesIO(read_private(self.checkpoint_path)), weights_only=True
        )
        if state.get("key_fingerprint") != key.fingerprint:
            raise PrivacyError(
                f"cannot resume: {self.checkpoint_path} was written under another key "
                f"({state.get('key_fingerprint')}, key file {key.fingerprint})"
            )
        return Release(
            key,
            origin,
            start_epoch=int(state["epoch"]) + 1,
            history=list(json.loads(state["history"])),
            party_state=state["party"],
        )

    def _write_key(
        self, key: NoiseKey, origin: str, binding: NoiseBinding | None
    ) -> None:
        record = {
            "format": KEY_FORMAT,
            "key": key.to_hex(),
            "secure": key.secure,
            "origin": origin,
            "fingerprint": key.fingerprint,
            "binding": None if binding is None else dict(binding.settings),
        }
        write_private(self.key_path, json.dumps(record, indent=2).encode())

    def _read_key(self) -> tuple[NoiseKey, str, NoiseBinding | None]:
        try:
            record = json.loads(read_private(self.key_path))
            if record.get("format") != KEY_FORMAT:
                raise ValueError(f"format {record.get('format')!r}")
            origin = record["origin"]
            if origin not in ORIGINS:
                raise ValueError(f"origin {origin!r}")
            key = NoiseKey.from_hex(record["key"], secure=origin == "os")
            bound = record["binding"]
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise PrivacyError(
                f"{self.key_path} is not a noise key file: {err}"
            ) from None
        return key, origin, None if bound is None else NoiseBinding(bound)

    # ----------------------------------------------------------- checkpoints
    def save_checkpoint(
        self,
        epoch: int,
        history: list[dict[str, Any]],
        party_state: dict[str, Any],
    ) -> None:
        """Keep the state after ``epoch`` (0-based) finished, atomically."""
        record = {
            "epoch": int(epoch),
            "party": party_state,
            "history": json.dumps(history, default=_jsonable),
            **_key_of(party_state),
        }
        buffer = io.BytesIO()
        torch.save(record, buffer)
        write_private(self.checkpoint_path, buffer.getvalue())

    def save_labels(self, name: str, labels: np.ndarray) -> Path:
        """Write an array of labels (the experimenter's ground truth) privately."""
        buffer = io.BytesIO()
        np.save(buffer, np.asarray(labels), allow_pickle=False)
        return write_private(self.folder / name, buffer.getvalue())


def _key_of(party_state: Mapping[str, Any]) -> dict[str, Any]:
    fingerprint = party_state.get("key_fingerprint")
    if not isinstance(fingerprint, str):
        raise PrivacyError("the label party's state names no key fingerprint")
    return {"key_fingerprint": fingerprint}


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")
