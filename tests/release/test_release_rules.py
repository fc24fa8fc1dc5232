"""Privacy that follows the transcript: releases, rehearsals and one release object.

Each test reproduces a way the ledger or a bound key gave an untrue epsilon on
the code before (issue: privacy accounting that follows the transcript,
items 2-6) and checks that it is refused, recorded or left untouched now.
"""

import json
import os
import stat
import subprocess
import sys

import numpy as np
import pytest
import torch

from tpsl_flwr.attacks.metrics import pooled_auc
from tpsl_flwr.errors import ConfigError, PrivacyError, ReleaseRefused
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.experiment import is_rehearsal
from tpsl_flwr.experiments.run import run_experiment, run_inprocess_experiment
from tpsl_flwr.experiments.run_folder import run_in_folder
from tpsl_flwr.models import TopModel
from tpsl_flwr.parties import LabelParty
from tpsl_flwr.privacy.accounting import privacy_spent
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms import make_mechanism
from tpsl_flwr.privacy.noisy_labels import draw_noisy_labels
from tpsl_flwr.release.label_set import MIN_SHARED, LabelSet, shingles
from tpsl_flwr.release.ledger import PrivacyLedger
from tpsl_flwr.release.store import LabelRecords, LabelStore, NoiseBinding
from tpsl_flwr.strategies import TPSLStrategy
from tpsl_flwr.testing import write_criteo

RNG = np.random.default_rng(5)
N = 4000
IDS = np.arange(N)
Y = (RNG.random(N) < 0.3).astype(np.int64)
SPACE = {"dataset": "criteo", "test-fraction": 0.2, "id-space": "beef"}


def _open(folder, epsilon=1.0, epochs=1, **options):
    mechanism = make_mechanism("laplace", epsilon=epsilon)
    binding = NoiseBinding.of(
        mechanism=mechanism, placement="logits", reuse_noise=True, id_space=SPACE
    )
    return LabelStore(folder).open_release(
        binding,
        resume=options.pop("resume", False),
        labels=options.pop("labels", LabelRecords(IDS, Y)),
        privacy=privacy_spent(mechanism=mechanism, epochs=epochs),
        **options,
    )


def _party(key, epsilon=1.0):
    torch.manual_seed(0)
    return LabelParty(
        TopModel(4, hidden=(8,), num_outputs=1),
        Y,
        make_mechanism("laplace", epsilon=epsilon),
        key,
    )


# ------------------------------------------------- item 2: one release object
def test_a_release_key_at_another_epsilon_is_refused_before_any_step(tmp_path):
    """Reproduction 2: eps 4 under an eps-1 release recovered every label."""
    # Prepare: the attack the old code allowed, on the same key by hand.
    release = _open(tmp_path / "lp")
    raw = NoiseKey(release.key.key, secure=True)  # the key without its binding
    c1 = draw_noisy_labels(make_mechanism("laplace", epsilon=1.0), Y, IDS, raw)
    c4 = draw_noisy_labels(make_mechanism("laplace", epsilon=4.0), Y, IDS, raw)
    combined = (4 * c4.coefficients[:, 1] - c1.coefficients[:, 1]) / 3
    assert pooled_auc(Y, combined) == 1.0  # what a second setting gives away
    # Execute / Assert: the release's key refuses another epsilon ...
    with pytest.raises(PrivacyError, match=r"epsilon \(1.0 -> 4.0\)"):
        _party(release.key, epsilon=4.0)
    # ... and a strategy refuses a party whose key was stripped of it.
    stripped = _party(raw, epsilon=4.0)
    with pytest.raises(PrivacyError, match="TPSLStrategy states other settings"):
        TPSLStrategy(stripped, epochs=1, release=release)


def test_a_strategy_is_checked_against_its_release_in_its_constructor(tmp_path):
    """A strategy that would spend more than its release is refused up front.

    Before, the check ran in ``summary()``, which an embedder may override.
    """

    class Quiet(TPSLStrategy):
        def summary(self):  # an embedder's override skips the settings log
            pass

    # Prepare: fresh noise each epoch, so epochs are releases per label.
    mechanism = make_mechanism("laplace", epsilon=1.0)
    binding = NoiseBinding.of(
        mechanism=mechanism, placement="logits", reuse_noise=False, id_space=SPACE
    )
    release = LabelStore(tmp_path / "lp").open_release(
        binding,
        resume=False,
        labels=LabelRecords(IDS, Y),
        privacy=privacy_spent(mechanism=mechanism, epochs=1, reuse_noise=False),
    )
    torch.manual_seed(0)
    party = LabelParty(
        TopModel(4, hidden=(8,), num_outputs=1),
        Y,
        mechanism,
        release.key,
        reuse_noise=False,
    )
    # Execute / Assert: 3 epochs are 3 releases per label, recorded for 1.
    with pytest.raises(PrivacyError, match="spends 3 release"):
        Quiet(party, epochs=3, release=release)
    assert Quiet(party, epochs=1, release=release).epochs == 1


def test_a_validation_hold_out_other_than_the_releases_is_refused(tmp_path):
    mechanism = make_mechanism("laplace", epsilon=1.0)
    binding = NoiseBinding.of(
        mechanism=mechanism,
        placement="logits",
        reuse_noise=True,
        id_space={**SPACE, "validation-fraction": 0.1},
    )
    release = LabelStore(tmp_path / "lp").open_release(
        binding,
        resume=False,
        labels=LabelRecords(IDS, Y),
        privacy=privacy_spent(mechanism=mechanism),
    )
    with pytest.raises(PrivacyError, match=r"validation-fraction 0\.0"):
        TPSLStrategy(_party(release.key), epochs=1, release=release)


def test_privacy_computed_for_another_epsilon_than_the_binding_is_refused(tmp_path):
    """Review: an eps-4 binding recorded at the eps 1 its privacy was made for."""
    four = make_mechanism("laplace", epsilon=4.0)
    binding = NoiseBinding.of(
        mechanism=four, placement="logits", reuse_noise=True, id_space=SPACE
    )
    with pytest.raises(ConfigError, match=r"spends epsilon 1\.0 over 1 release"):
        LabelStore(tmp_path / "lp").open_release(
            binding,
            resume=False,
            labels=LabelRecords(IDS, Y),
            privacy=privacy_spent(mechanism=make_mechanism("laplace", epsilon=1.0)),
        )
    assert not (tmp_path / "lp").exists()


def test_a_release_key_is_checked_again_when_the_strategy_starts(tmp_path):
    """Review: a bound key without its release, more rounds, a party changed."""
    release = _open(tmp_path / "lp", epochs=2)
    with pytest.raises(PrivacyError, match="belongs to a release"):
        TPSLStrategy(_party(release.key), epochs=1)
    # Start checks again, before any node is contacted (grid None: never used).
    strategy = TPSLStrategy(_party(release.key), epochs=2, release=release)
    strategy.party.mechanism = make_mechanism("laplace", epsilon=8.0)
    with pytest.raises(PrivacyError, match=r"epsilon \(1.0 -> 8.0\)"):
        strategy.start(grid=None)  # type: ignore[arg-type]


# ------------------------------------------------ item 3: a ledger not reset
def test_a_missing_secret_over_ledger_entries_is_refused(tmp_path):
    """Reproduction 3: a new secret made the same labels two sets at total 1."""
    ledger = PrivacyLedger(tmp_path / "ledger")
    _open(tmp_path / "a", ledger=ledger)
    (ledger.folder / "secret.key").unlink()  # a backup restored without it
    with pytest.raises(PrivacyError, match=r"secret\.key is missing"):
        _open(tmp_path / "b", ledger=ledger, new_release=True)
    assert not (ledger.folder / "secret.key").exists()


def test_a_ledger_under_a_folder_others_may_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # no sticky bit: others may rename the ledger away
    with pytest.raises(PrivacyError, match="others may write to it"):
        _open(tmp_path / "a", ledger=PrivacyLedger(shared / "ledger"))
    os.chmod(shared, 0o777 | stat.S_ISVTX)  # as /tmp: allowed
    assert _open(tmp_path / "a", ledger=PrivacyLedger(shared / "ledger")).ledger


# ------------------------------------------------ item 4: shifted label files
def _shifted_copies(y):
    rng = np.random.default_rng(11)
    return {
        "one row shifted": y[1:],
        "a header row": np.r_[0, y],
        "first row duplicated": np.r_[y[0], y],
        "5 rows dropped": np.delete(y, rng.choice(y.size, 5, replace=False)),
        "5 rows added": np.insert(y, rng.choice(y.size, 5), 1),
        "every label flipped": 1 - y,
    }


@pytest.mark.parametrize("rate", [0.03, 0.25, 0.5, 0.8])
def test_shifted_and_edited_copies_of_a_label_set_are_the_same_set(rate):
    # Prepare: 20k labels of a given positive rate.
    y = (np.random.default_rng(3).random(20_000) < rate).astype(np.int8)
    original = LabelSet.of(np.arange(y.size), y, secret=b"k" * 32, public=False)
    for name, copy in _shifted_copies(y).items():
        # Execute: the copy's ids are row numbers again, so every pair moved.
        other = LabelSet.of(np.arange(copy.size), copy, secret=b"k" * 32, public=False)
        # Assert
        assert other.overlaps(original) and original.overlaps(other), name


def test_unrelated_label_sets_share_no_winnowed_hash():
    """The false-match rate: 0 of 3,600 pairs of unrelated label sets linked.

    Independent labels at five positive rates and three sizes; 0 of 3,600
    pairs share even one kept hash (docs/privacy.md quotes a larger run:
    0 of 11,700).
    """
    rng = np.random.default_rng(2026)
    linked = shared_any = pairs = 0
    for rate in (0.01, 0.05, 0.25, 0.5, 0.7):
        for size in (1000, 5000, 20_000):
            sets = [
                shingles((rng.random(size) < rate).astype(np.int8), b"s" * 32)
                for _ in range(16)
            ]
            for i in range(len(sets)):
                for j in range(i + 1, len(sets)):
                    shared = len(sets[i] & sets[j])
                    pairs += 1
                    shared_any += shared > 0
                    linked += shared >= MIN_SHARED
    assert pairs == 1800 and linked == 0 and shared_any == 0


@pytest.fixture()
def criteo_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("criteo") / "train.txt"
    write_criteo(path, 3000, seed=4, positive_rate=0.25)
    return path


def _criteo(out, path, **fields):
    return ExperimentConfig(
        dataset="criteo",
        data_path=str(path),
        epochs=1,
        batch_size=256,
        validation_fraction=0.0,
        out_dir=str(out),
        **fields,
    )


def test_a_file_shifted_by_one_row_is_the_same_labels(tmp_path, criteo_file):
    """Reproduction 4: ``tail -n +2`` was admitted at "total 1.0" three times."""
    lines = criteo_file.read_text().splitlines(keepends=True)
    shifted = tmp_path / "shifted.txt"
    shifted.write_text("".join(lines[1:]))
    doubled = tmp_path / "doubled.txt"
    doubled.write_text("".join([lines[0], *lines]))
    first = run_experiment(_criteo(tmp_path / "a", criteo_file, release=True))
    assert first["epsilon_total"] == 1.0
    for i, copy in enumerate((shifted, doubled)):
        with pytest.raises(ReleaseRefused, match="released 1 time"):
            run_experiment(_criteo(tmp_path / f"b{i}", copy, release=True))


# ------------------------------------------------ item 5: what leaves counts
def test_rehearsals_are_recorded_never_refused_and_not_counted(tmp_path, criteo_file):
    """Reproduction 5: an unprotected in-process baseline made the total inf."""
    # Execute: the researcher's path: a baseline, then protected runs, in-process.
    base = run_experiment(_criteo(tmp_path / "none", criteo_file, mechanism="none"))
    protected = run_experiment(_criteo(tmp_path / "lap", criteo_file, epsilon=2.0))
    # Assert: recorded as rehearsals, not counted, nothing to acknowledge.
    for results in (base, protected):
        assert results["run_kind"] == "rehearsal"
        assert results["ledger"]["kind"] == "rehearsal"
        assert results["epsilon_total"] == 0.0
    assert protected["epsilon_spent"] == 2.0
    entries = PrivacyLedger().sets()[0][1]
    assert [e.kind for e in entries] == ["rehearsal", "rehearsal"]
    # A real release afterwards is the first one counted: total 1, not inf.
    release = run_experiment(_criteo(tmp_path / "rel", criteo_file, release=True))
    assert release["run_kind"] == "release" and release["epsilon_total"] == 1.0
    # A second release is refused with its true total.
    with pytest.raises(ReleaseRefused, match="total would be epsilon 2"):
        run_experiment(_criteo(tmp_path / "rel2", criteo_file, release=True))


def test_an_unprotected_release_needs_its_own_flag(tmp_path, criteo_file):
    cfg = _criteo(tmp_path / "a", criteo_file, mechanism="none", release=True)
    with pytest.raises(ReleaseRefused, match="--unprotected-release"):
        run_experiment(cfg)
    done = run_experiment(
        _criteo(
            tmp_path / "a",
            criteo_file,
            mechanism="none",
            release=True,
            unprotected_release=True,
        )
    )
    assert done["run_kind"] == "release" and done["epsilon_total"] == "inf"


def failing_app(message, context):
    raise RuntimeError("node 0 could not read its columns")


def test_a_release_that_failed_before_its_first_gradient_is_void(tmp_path, criteo_file):
    """Reproduction 5: four failed debugging runs were four eps-2 releases."""
    for attempt in range(2):
        cfg = _criteo(tmp_path / f"fail{attempt}", criteo_file, release=True)
        with pytest.raises(Exception, match="could not read its columns"):
            run_inprocess_experiment(cfg, client_app=failing_app, timeout=5)
    kinds = [e.kind for e in PrivacyLedger().sets()[0][1]]
    assert kinds == ["release", "void", "release", "void"]
    # Assert: nothing counted, so the working run is admitted at total 1.
    done = run_experiment(_criteo(tmp_path / "ok", criteo_file, release=True))
    assert done["epsilon_total"] == 1.0 and done["ledger"]["earlier_releases"] == 0


def test_a_deployment_is_a_release_unless_the_label_partys_launcher_marked_it(
    tmp_path, monkeypatch
):
    from flwr.superlink.grid import HttpGrid, InMemoryGrid

    from tpsl_flwr.engines.processes import LAUNCH_ID_ENV

    deployment = object.__new__(HttpGrid)  # only its type is read
    store = LabelStore(tmp_path / "lp")
    monkeypatch.setenv(LAUNCH_ID_ENV, "launch-a")  # what this ServerApp inherited
    assert not is_rehearsal(deployment, store)  # someone else's SuperNodes
    store.mark_rehearsal("launch-a")  # the local deployment engine's own launch
    assert is_rehearsal(deployment, store)
    assert not is_rehearsal(deployment, store)  # taken: no later run finds it
    # A crashed launcher's mark never makes another launch's run a rehearsal.
    store.mark_rehearsal("launch-crashed")
    assert not is_rehearsal(deployment, store)
    assert not (store.folder / "rehearsal.json").exists()
    monkeypatch.delenv(LAUNCH_ID_ENV)  # `flwr run . remote`: no launch of ours
    store.mark_rehearsal("launch-a")
    assert not is_rehearsal(deployment, store)
    monkeypatch.setenv(LAUNCH_ID_ENV, "launch-a")
    store.mark_rehearsal("launch-a")
    record = json.loads((store.folder / "rehearsal.json").read_text())
    record["written"] -= 3600  # a launcher's mark from an hour ago
    (store.folder / "rehearsal.json").write_text(json.dumps(record))
    assert not is_rehearsal(deployment, store)
    assert is_rehearsal(object.__new__(InMemoryGrid), store)  # Ray simulation


# ------------------------------------------- item 6: refused means untouched
def test_a_refused_release_leaves_the_folder_and_results_untouched(
    tmp_path, criteo_file
):
    """Reproduction 6: FAILED and label-party/ were left; results rotated."""
    run_experiment(_criteo(tmp_path / "a", criteo_file, release=True))
    # A refused fresh run into a new folder writes nothing there.
    with pytest.raises(ReleaseRefused):
        run_experiment(_criteo(tmp_path / "b", criteo_file, release=True))
    assert not (tmp_path / "b").exists()
    # A refused --overwrite of a finished run keeps that run as it was.
    before = sorted(p.name for p in (tmp_path / "a").iterdir())
    results = (tmp_path / "a" / "results.json").read_bytes()
    with pytest.raises(ReleaseRefused):
        run_experiment(
            _criteo(tmp_path / "a", criteo_file, release=True), overwrite=True
        )
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == before
    assert (tmp_path / "a" / "results.json").read_bytes() == results
    # The one command the refusal names works, in the same folder.
    done = run_experiment(
        _criteo(tmp_path / "b", criteo_file, release=True, new_release=True)
    )
    assert done["epsilon_total"] == 2.0


def test_a_refused_run_under_flwr_run_rotates_no_results(tmp_path):
    """Reproduction 6: a refused ServerApp run retired the good results.json."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.json").write_text("good")
    (out / "results.previous.json").write_text("older")

    def refused():
        raise ReleaseRefused("these labels were released 1 time(s) before")

    with pytest.raises(ReleaseRefused):
        run_in_folder(out, refused)
    assert (out / "results.json").read_text() == "good"
    assert (out / "results.previous.json").read_text() == "older"
    assert sorted(p.name for p in out.iterdir()) == [
        "results.json",
        "results.previous.json",
    ]
    with pytest.raises(ReleaseRefused):
        run_in_folder(tmp_path / "new", refused)
    assert not (tmp_path / "new").exists()


def test_the_cli_refusal_names_the_command_and_writes_nothing(tmp_path, criteo_file):
    common = [
        sys.executable,
        "-m",
        "tpsl_flwr.cli",
        "simulate",
        "--dataset",
        "criteo",
        "--data-path",
        str(criteo_file),
        "--epochs",
        "1",
        "--validation-fraction",
        "0",
        "--no-audit",
        "--release",
    ]
    env = {**os.environ}
    first = subprocess.run(
        [*common, "--out-dir", str(tmp_path / "a")], env=env, capture_output=True
    )
    assert first.returncode == 0, first.stderr.decode()[-2000:]
    second = subprocess.run(
        [*common, "--out-dir", str(tmp_path / "b")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert second.returncode == 2 and "--new-release" in second.stderr
    assert not (tmp_path / "b").exists()


def test_a_serverapp_refuses_an_installed_bundle_holding_a_key(tmp_path, monkeypatch):
    """Review: a plain ``flwr run .`` packed a sweep folder with its key."""
    from tpsl_flwr.engines.app_bundle import check_installed_app

    home = tmp_path / "flwr-home"
    app = home / "apps" / "tpsl-flwr.tpsl-flwr.0.1.0.abcd1234"
    (app / "mysweep" / "runs" / "a" / "label-party").mkdir(parents=True)
    (app / "pyproject.toml").write_text("[project]\n")
    (app / "mysweep" / "runs" / "a" / "label-party" / "noise-key.json").write_text("{}")
    monkeypatch.setenv("FLWR_HOME", str(home))
    monkeypatch.setattr(sys, "path", [str(app), *sys.path])
    with pytest.raises(PrivacyError, match=r"noise-key\.json"):
        check_installed_app()
    monkeypatch.setattr(sys, "path", sys.path[1:])
    check_installed_app()  # not started from an installed bundle: nothing to check


def test_a_shared_rehearsal_is_recorded_as_a_release(tmp_path, criteo_file):
    """A rehearsal's nodes' outputs, once shared, release the labels."""
    from tpsl_flwr.cli.main import main

    rehearsal = run_experiment(_criteo(tmp_path / "r", criteo_file, epsilon=2.0))
    assert rehearsal["run_kind"] == "rehearsal" and rehearsal["epsilon_total"] == 0
    label_dir = str(tmp_path / "r" / "label-party")
    assert main(["ledger", "release", label_dir]) == 0
    ((_, entries),) = PrivacyLedger().sets()
    assert [e.kind for e in entries] == ["rehearsal", "release"]
    assert PrivacyLedger().total(PrivacyLedger().sets()[0][0]).epsilon == 2.0
    # A further real release is now refused, naming the total with the shared one.
    with pytest.raises(ReleaseRefused, match="total would be epsilon 3"):
        run_experiment(_criteo(tmp_path / "rel", criteo_file, release=True))
