"""The label party's private folder: file modes, the key's binding, checkpoints."""

import json
import os
import stat

import numpy as np
import pytest
import torch

from tpsl_flwr._util.private_files import make_private_dir, read_private, write_private
from tpsl_flwr.errors import PrivacyError
from tpsl_flwr.privacy.accounting import privacy_spent
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms import make_mechanism
from tpsl_flwr.release.store import LabelRecords, LabelStore, NoiseBinding

ID_SPACE = {"dataset": "digits", "rows": 0, "seed": 0, "id-space": "f00d"}


def binding(mechanism="laplace", placement="logits", reuse=True, **space):
    params = {"sigma": 1.0} if mechanism == "gaussian" else {"epsilon": 1.0}
    params.update({k: space.pop(k) for k in ("epsilon", "sigma") if k in space})
    return NoiseBinding.of(
        mechanism=make_mechanism(mechanism, **params),
        placement=placement,
        reuse_noise=reuse,
        id_space={**ID_SPACE, **space},
    )


LABELS = LabelRecords(np.arange(40), np.arange(40) % 2)


def release_of(store, noise_binding, *, resume, labels=LABELS, **options):
    return store.open_release(
        noise_binding,
        resume=resume,
        labels=labels,
        privacy=privacy_spent(mechanism=make_mechanism("laplace", epsilon=1.0)),
        **{"public_labels": True, **options},
    )


def mode(path):
    return stat.S_IMODE(path.stat().st_mode)


def party_state(key):
    return {"top": {"w": torch.ones(2)}, "steps": 3, "key_fingerprint": key.fingerprint}


# --------------------------------------------------------------- private files
def test_private_files_are_0600_in_a_0700_folder(tmp_path):
    path = write_private(tmp_path / "party" / "secret.bin", b"abc")
    assert mode(path) == 0o600
    assert mode(path.parent) == 0o700
    assert read_private(path) == b"abc"
    assert not list(path.parent.glob(".*.tmp"))  # written atomically


def test_a_file_others_may_read_is_refused_as_ssh_does(tmp_path):
    path = write_private(tmp_path / "party" / "secret.bin", b"abc")
    os.chmod(path, 0o644)
    with pytest.raises(PrivacyError, match=r"mode 0644.*chmod 600"):
        read_private(path)


def test_a_folder_others_may_write_is_refused(tmp_path):
    folder = make_private_dir(tmp_path / "party")
    write_private(folder / "secret.bin", b"abc")
    os.chmod(folder, 0o770)
    with pytest.raises(PrivacyError, match="mode 0770"):
        read_private(folder / "secret.bin")
    with pytest.raises(PrivacyError, match="mode 0770"):
        make_private_dir(folder)


# ------------------------------------------------------------------ the key
def test_a_fresh_run_draws_an_os_key_and_binds_it(tmp_path):
    store = LabelStore(tmp_path / "lp")
    release = release_of(store, binding(), resume=False)
    assert release.key.secure and release.origin == "os" and release.start_epoch == 0
    record = json.loads(store.key_path.read_text())  # JSON: loading runs no code
    assert record["binding"]["epsilon"] == 1.0
    assert record["binding"]["id-space"] == "f00d"
    assert record["fingerprint"] == release.key.fingerprint
    assert mode(store.key_path) == 0o600 and mode(store.folder) == 0o700


def test_a_provided_seeded_key_is_taken_by_the_next_fresh_run_only(tmp_path):
    store = LabelStore(tmp_path / "lp")
    seeded = NoiseKey.from_seed(5)
    store.provide_key(seeded, "seed")
    first = release_of(store, binding(), resume=False)
    # The run's key is derived from the seed, the binding and the labels.
    assert first.key != seeded and first.origin == "seed" and not first.key.secure
    again = LabelStore(tmp_path / "again")
    again.provide_key(seeded, "seed")
    assert release_of(again, binding(), resume=False).key == first.key
    # Once bound, a new fresh run does not reuse it: it is a new release.
    second = release_of(store, binding(), resume=False)
    assert second.key != seeded and second.origin == "os"


def test_provide_key_refuses_an_origin_that_contradicts_the_key(tmp_path):
    with pytest.raises(ValueError, match="origin must be"):
        LabelStore(tmp_path).provide_key(NoiseKey.from_seed(1), "os")


@pytest.mark.parametrize(
    ("changed", "named"),
    [
        (binding(epsilon=4.0), "epsilon (1.0 -> 4.0)"),
        (binding("gaussian"), "mechanism ('laplace' -> 'gaussian')"),
        (binding(placement="cut"), "placement ('logits' -> 'cut')"),
        (binding(reuse=False), "reuse-noise (True -> False)"),
        (binding(seed=1), "seed (0 -> 1)"),
        (binding(rows=500), "rows (0 -> 500)"),
        (binding(**{"id-space": "beef"}), "id-space ('f00d' -> 'beef')"),
    ],
)
def test_resume_with_anything_that_fixes_the_noise_changed_is_refused(
    tmp_path, changed, named
):
    # Prepare: one finished epoch under the original binding.
    store = LabelStore(tmp_path / "lp")
    release = release_of(store, binding(), resume=False)
    store.save_checkpoint(0, [{"epoch": 1}], party_state(release.key))
    # Execute / Assert
    with pytest.raises(PrivacyError, match="changed since the checkpoint") as err:
        release_of(store, changed, resume=True)
    assert named in str(err.value)
    assert release.key.fingerprint in str(err.value)


def test_resume_with_the_same_binding_restores_key_epoch_history_and_state(tmp_path):
    store = LabelStore(tmp_path / "lp")
    release = release_of(store, binding(), resume=False)
    store.save_checkpoint(1, [{"epoch": 1}, {"epoch": 2}], party_state(release.key))
    assert mode(store.checkpoint_path) == 0o600
    again = release_of(store, binding(), resume=True)
    assert again.key == release.key
    assert again.start_epoch == 2
    assert again.history == [{"epoch": 1}, {"epoch": 2}]
    assert again.party_state is not None and again.party_state["steps"] == 3


def test_resume_without_a_key_is_refused_not_silently_restarted(tmp_path):
    store = LabelStore(tmp_path / "lp")
    with pytest.raises(PrivacyError, match="no noise key"):
        release_of(store, binding(), resume=True)


def test_a_crash_before_the_first_checkpoint_resumes_the_same_release(tmp_path):
    # Gradients may have left in the first epoch: a resume goes on under the
    # same key from epoch 0 instead of asking for a second release.
    store = LabelStore(tmp_path / "lp")
    first = release_of(store, binding(), resume=False, public_labels=False)
    again = release_of(store, binding(), resume=True, public_labels=False)
    assert again.key == first.key and again.start_epoch == 0
    assert again.ledger is not None and again.ledger.total.releases == 1


def test_a_key_file_others_can_read_is_refused_on_resume(tmp_path):
    store = LabelStore(tmp_path / "lp")
    release = release_of(store, binding(), resume=False)
    store.save_checkpoint(0, [], party_state(release.key))
    os.chmod(store.key_path, 0o644)
    with pytest.raises(PrivacyError, match="mode 0644"):
        release_of(store, binding(), resume=True)


def test_a_checkpoint_written_under_another_key_is_refused(tmp_path):
    store = LabelStore(tmp_path / "lp")
    release_of(store, binding(), resume=False)
    store.save_checkpoint(0, [], party_state(NoiseKey.from_seed(9)))
    with pytest.raises(PrivacyError, match="under another key"):
        release_of(store, binding(), resume=True)


def test_a_checkpoint_holding_code_is_not_run_on_load(tmp_path):
    # Prepare: a planted checkpoint whose pickle would run code if unpickled
    # without weights_only.
    store = LabelStore(tmp_path / "lp")
    release = release_of(store, binding(), resume=False)
    store.save_checkpoint(0, [], party_state(release.key))
    planted = tmp_path / "planted"

    class Boom:
        def __reduce__(self):
            return (os.mkdir, (str(planted),))

    write_private(store.checkpoint_path, _pickled({"epoch": 0, "x": Boom()}))
    # Execute / Assert
    with pytest.raises(Exception, match=r"(?i)weights_only|unsupported|global"):
        release_of(store, binding(), resume=True)
    assert not planted.exists()


def _pickled(obj):
    import io

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()
