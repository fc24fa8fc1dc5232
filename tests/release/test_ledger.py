"""Privacy across runs: the ledger per label set, keys bound to labels and settings.

Each test reproduces a way one label set could be released twice (issue:
privacy across runs, items 2-4) and checks that it is refused, or recorded
and reported as a total.
"""

import json
import math

import numpy as np
import pytest

from tpsl_flwr.attacks.metrics import pooled_auc as roc_auc
from tpsl_flwr.errors import PrivacyError
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.run import run_experiment
from tpsl_flwr.privacy.accounting import privacy_spent
from tpsl_flwr.privacy.closed_forms import auc_bound
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms import make_mechanism
from tpsl_flwr.privacy.noisy_labels import draw_noisy_labels
from tpsl_flwr.release.label_set import LabelSet
from tpsl_flwr.release.ledger import LedgerEntry, PrivacyLedger, compose
from tpsl_flwr.release.store import LabelRecords, LabelStore, NoiseBinding
from tpsl_flwr.testing import write_criteo

RNG = np.random.default_rng(0)
N = 20_000
IDS = np.arange(N)
Y = (RNG.random(N) < 0.3).astype(np.int64)
SPACE = {"dataset": "criteo", "test-fraction": 0.2, "id-space": "f00d"}


def open_release(folder, *, epsilon=1.0, labels=None, space=None, **options):
    mechanism = make_mechanism("laplace", epsilon=epsilon)
    binding = NoiseBinding.of(
        mechanism=mechanism,
        placement="logits",
        reuse_noise=True,
        id_space=space or SPACE,
    )
    return LabelStore(folder).open_release(
        binding,
        resume=options.pop("resume", False),
        labels=labels or LabelRecords(IDS, Y),
        privacy=privacy_spent(mechanism=mechanism),
        **options,
    )


# ------------------------------------------------------------ a second release
def test_a_second_fresh_release_of_the_same_labels_is_refused_then_totalled(
    tmp_path,
):
    # Execute: two label-party folders (a new out-dir, or --overwrite).
    first = open_release(tmp_path / "run-1")
    with pytest.raises(PrivacyError, match=r"released 1 time\(s\) before") as err:
        open_release(tmp_path / "run-2")
    assert "total would be epsilon 2" in str(err.value)
    assert not (tmp_path / "run-2" / "noise-key.json").exists()  # nothing bound
    second = open_release(tmp_path / "run-2", new_release=True)
    # Assert: a total over both keys; the PLD never above the pure sum.
    assert first.ledger is not None and second.ledger is not None
    assert first.ledger.total.epsilon == 1.0 and first.ledger.earlier == 0
    assert second.ledger.total.epsilon == 2.0 and second.ledger.earlier == 1
    assert second.ledger.total.releases == 2 and second.ledger.acknowledged
    assert 1.0 < second.ledger.total.epsilon_at_delta <= 2.0
    assert second.key.fingerprint != first.key.fingerprint


def test_the_acknowledgement_file_is_the_label_partys_and_used_once(tmp_path):
    open_release(tmp_path / "run-1")
    store = LabelStore(tmp_path / "run-2")
    path = store.acknowledge_new_release()
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    open_release(tmp_path / "run-2")  # consumes it
    assert not path.exists()
    with pytest.raises(PrivacyError, match=r"released 2 time\(s\)"):
        open_release(tmp_path / "run-3")


def test_a_budget_refuses_the_release_that_would_exceed_it(tmp_path):
    open_release(tmp_path / "a", epsilon=1.0)
    open_release(tmp_path / "b", epsilon=1.5, new_release=True, budget=2.5)
    with pytest.raises(PrivacyError, match=r"total epsilon of 3\.5.*budget 3\.0"):
        open_release(tmp_path / "c", new_release=True, budget=3.0)
    assert not (tmp_path / "c" / "noise-key.json").exists()


def test_public_rehearsal_labels_are_recorded_but_never_refused(tmp_path):
    open_release(tmp_path / "a", public_labels=True)
    again = open_release(tmp_path / "b", public_labels=True)
    assert again.ledger is not None and again.ledger.public_labels
    assert again.ledger.total.epsilon == 2.0 and again.ledger.earlier == 1


def test_the_same_key_and_settings_are_one_release_not_two(tmp_path):
    # A plain/posterior pair: one seed, one binding, the same noisy labels.
    for name in ("plain", "posterior"):
        LabelStore(tmp_path / name).provide_key(NoiseKey.from_seed(3), "seed")
    a = open_release(tmp_path / "plain")
    b = open_release(tmp_path / "posterior")
    assert a.key == b.key
    assert b.ledger is not None and b.ledger.total.epsilon == 1.0


def test_a_row_limit_of_the_same_labels_is_the_same_label_set(tmp_path):
    open_release(tmp_path / "all")
    head = LabelRecords(IDS[:5000], Y[:5000])
    with pytest.raises(PrivacyError, match="released 1 time"):
        open_release(tmp_path / "head", labels=head)
    # Other labels on the same ids (a relabelled copy, 1 - Y, is the same
    # labels: test_release_rules).
    independent = (np.random.default_rng(99).random(5000) < 0.3).astype(np.int64)
    other = LabelRecords(IDS[:5000], independent)
    assert open_release(tmp_path / "other", labels=other).ledger.earlier == 0


def test_label_set_fingerprints_are_keyed_and_order_free():
    a = LabelSet.of(IDS, Y, secret=b"a" * 32, public=False)
    shuffled = RNG.permutation(N)
    assert a == LabelSet.of(IDS[shuffled], Y[shuffled], secret=b"a" * 32, public=False)
    assert (
        a.fingerprint != LabelSet.of(IDS, Y, secret=b"b" * 32, public=False).fingerprint
    )


def test_the_ledger_is_append_only_private_and_survives_its_run_folders(tmp_path):
    open_release(tmp_path / "a")
    ledger = PrivacyLedger()
    ((label_set, _),) = ledger.sets()
    path = ledger.folder / f"{label_set.fingerprint}.jsonl"
    before = path.read_bytes()
    open_release(tmp_path / "b", new_release=True)
    assert path.read_bytes().startswith(before)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert oct(ledger.folder.stat().st_mode & 0o777) == "0o700"
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[2])["acknowledged"] is True
    assert b"0, 1" not in path.read_bytes()  # no label, only fingerprints


def test_a_damaged_ledger_stops_every_release(tmp_path):
    open_release(tmp_path / "a")
    ((label_set, _),) = PrivacyLedger().sets()
    path = PrivacyLedger().folder / f"{label_set.fingerprint}.jsonl"
    path.write_text("not json\n")
    with pytest.raises(PrivacyError, match="not a ledger file"):
        open_release(tmp_path / "b", new_release=True)


def test_composition_of_unprotected_and_gaussian_releases():
    laplace = LedgerEntry(
        "k1", "laplace", "epsilon", 1.0, 2, "logits", True, 1, 1, 1.0, "os"
    )
    clear = LedgerEntry(
        "k2", "none", None, None, 2, "logits", True, 1, 1, math.inf, "os"
    )
    gauss = LedgerEntry(
        "k3", "gaussian", "sigma", 1.0, 2, "logits", True, 1, 1, None, "os"
    )
    assert compose([laplace, clear]).epsilon == math.inf
    total = compose([laplace, gauss])
    # No pure total with a Gaussian release (inf, never None); both are
    # add/remove events, so the PLD still states an (eps, delta).
    assert total.epsilon == math.inf and 1.0 < total.epsilon_at_delta < math.inf


# ------------------------------------------------------------- keys bound
def _coefficients(key, epsilon):
    mechanism = make_mechanism("laplace", epsilon=epsilon)
    return draw_noisy_labels(mechanism, Y, IDS, key).coefficients[:, 1]


def test_one_seed_at_two_epsilons_gives_independent_noise(tmp_path):
    """Item 3: with one word, ``2 c2 - c1 = y`` recovered every label."""
    # Prepare: the attack on a shared key (the old behaviour) recovers all.
    shared = NoiseKey.from_seed(1)
    combined = 2 * _coefficients(shared, 2.0) - _coefficients(shared, 1.0)
    assert roc_auc(Y, combined) == 1.0
    # Execute: the same seed, provided to two runs at eps 1 and eps 2.
    keys = {}
    for epsilon in (1.0, 2.0):
        folder = tmp_path / f"eps{epsilon}"
        LabelStore(folder).provide_key(NoiseKey.from_seed(1), "seed")
        keys[epsilon] = open_release(
            folder, epsilon=epsilon, new_release=epsilon == 2.0
        ).key
    # Assert: the same combination now stays within the composed ceiling
    # (eps 1 + eps 2 = 3: any attack's AUC <= e^3 / (1 + e^3) = 0.953),
    # 3 standard errors of an AUC over 20k labels (<= 0.004) as tolerance.
    assert keys[1.0] != keys[2.0]
    combined = 2 * _coefficients(keys[2.0], 2.0) - _coefficients(keys[1.0], 1.0)
    assert roc_auc(Y, combined) <= auc_bound(3.0) + 0.012


def test_a_changed_test_fraction_gives_another_key_from_one_seed(tmp_path):
    keys = []
    for fraction in (0.2, 0.3):
        folder = tmp_path / f"f{fraction}"
        LabelStore(folder).provide_key(NoiseKey.from_seed(0), "seed")
        space = {**SPACE, "test-fraction": fraction}
        keys.append(open_release(folder, space=space, public_labels=True).key)
    assert keys[0] != keys[1]


def test_resume_over_another_label_column_is_refused(tmp_path):
    """Item 4: same ids, other labels, same key showed ``c_old + c_new = 1``."""
    open_release(tmp_path / "lp")
    with pytest.raises(PrivacyError, match=r"changed since the checkpoint: labels"):
        open_release(tmp_path / "lp", resume=True, labels=LabelRecords(IDS, 1 - Y))


# ----------------------------------------------------------- whole runs
@pytest.fixture(scope="module")
def criteo_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("criteo") / "train.txt"
    return str(write_criteo(path, 1200, seed=4).path)


def _criteo(out, path, **fields):
    return ExperimentConfig(
        dataset="criteo",
        data_path=path,
        epochs=1,
        batch_size=256,
        validation_fraction=0.0,
        out_dir=str(out),
        **fields,
    )


def test_overwrite_of_a_real_file_run_is_a_second_release(tmp_path, criteo_file):
    """Item 2: ``--overwrite`` drew a second key and reported eps 1 again."""
    out = tmp_path / "run"
    first = run_experiment(_criteo(out, criteo_file, release=True), overwrite=True)
    assert first["epsilon_total"] == 1.0 and first["run_kind"] == "release"
    with pytest.raises(PrivacyError, match="further release"):
        run_experiment(_criteo(out, criteo_file, release=True), overwrite=True)
    second = run_experiment(
        _criteo(out, criteo_file, new_release=True, release=True), overwrite=True
    )
    assert second["epsilon_spent"] == 1.0 and second["epsilon_total"] == 2.0
    assert second["ledger"]["earlier_releases"] == 1
    assert any("released 1 time(s) before" in n for n in second["privacy"]["notes"])


def test_a_node_that_knows_a_published_seed_cannot_compute_the_key(tmp_path):
    """Item 6: a sweep's published seed and the run name in out-dir gave the key."""
    from tpsl_flwr.experiments.sweep.config import run_noise_seed

    seed = run_noise_seed(0, "criteo_laplace_eps1_seed0")
    LabelStore(tmp_path / "lp").provide_key(NoiseKey.from_seed(seed), "seed")
    key = open_release(tmp_path / "lp").key
    # What a node can compute from the seed and the public binding alone.
    guess = NoiseKey.from_seed(seed)
    assert key != guess and key.fingerprint != guess.fingerprint


def test_ledger_cli_acknowledges_and_shows(tmp_path, capsys):
    from tpsl_flwr.cli.main import main

    open_release(tmp_path / "a")
    assert main(["ledger", "acknowledge", str(tmp_path / "b"), "--budget", "3"]) == 0
    again = open_release(tmp_path / "b")
    assert again.ledger is not None and again.ledger.acknowledged
    capsys.readouterr()
    assert main(["ledger", "show"]) == 0
    shown = capsys.readouterr().out
    assert "total epsilon 2 over 2 release(s)" in shown
    assert shown.count("laplace epsilon 1") == 2 and "[acknowledged]" in shown
    assert main(["ledger", "show", "--json"]) == 0
    (record,) = json.loads(capsys.readouterr().out)
    assert record["total"]["epsilon"] == 2.0


def test_label_party_decisions_are_refused_in_the_run_config():
    from tpsl_flwr.errors import ConfigError

    for key in ("new-release", "privacy-budget"):
        with pytest.raises(ConfigError, match=f"{key} is not a run-config key"):
            ExperimentConfig.from_run_config({key: True if "new" in key else 2.0})
    assert "new-release" not in ExperimentConfig(new_release=True).to_run_config()


def test_a_sweep_over_a_files_labels_is_one_acknowledged_decision(
    tmp_path, criteo_file
):
    from tpsl_flwr.errors import ConfigError
    from tpsl_flwr.experiments.sweep.run import load_sweep, run_sweep

    config = tmp_path / "sweep.toml"
    config.write_text(
        "[grid]\ndatasets = ['criteo']\nmechanisms = ['laplace']\n"
        "epsilons = [1, 2]\nseeds = [0]\n\n[experiment]\n"
        f"data-path = '{criteo_file}'\nepochs = 1\nvalidation-fraction = 0.0\n"
    )
    sweep = load_sweep(config)
    with pytest.raises(ConfigError, match="pass --new-release"):
        run_sweep(sweep, tmp_path / "out", progress=False, release=True)
    assert not (tmp_path / "out" / "runs").exists()
    done = run_sweep(
        sweep, tmp_path / "out", progress=False, new_release=True, release=True
    )
    totals = sorted(
        json.loads((tmp_path / "out" / "runs" / name / "results.json").read_text())[
            "epsilon_total"
        ]
        for name in done["ran"]
    )
    assert totals == [1.0, 3.0]  # the second run's total counts the first


def test_a_fresh_run_in_the_same_folder_does_not_replace_its_key_silently(tmp_path):
    """Item 2: ``open_release(resume=False)`` replaced a bound key silently."""
    first = open_release(tmp_path / "lp")
    before = (tmp_path / "lp" / "noise-key.json").read_bytes()
    with pytest.raises(PrivacyError, match="further release"):
        open_release(tmp_path / "lp")
    assert (tmp_path / "lp" / "noise-key.json").read_bytes() == before
    assert open_release(tmp_path / "lp", resume=True).key == first.key


# ------------------------------------------- found by the adversarial review
def _race(i, folder, barrier, queue):
    import os

    os.environ.update(folder)
    barrier.wait()
    try:
        open_release(f"{folder['TPSL_FLWR_LEDGER_DIR']}-run{i}")
        queue.put("admitted")
    except PrivacyError:
        queue.put("refused")


def test_two_runs_started_at_once_are_admitted_one_after_the_other(tmp_path):
    import multiprocessing as mp
    import os

    # Prepare: two processes that open a release of the same labels together.
    context = mp.get_context("fork")
    barrier, queue = context.Barrier(2), context.Queue()
    env = {"TPSL_FLWR_LEDGER_DIR": os.environ["TPSL_FLWR_LEDGER_DIR"]}
    workers = [
        context.Process(target=_race, args=(i, env, barrier, queue)) for i in (0, 1)
    ]
    # Execute
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    # Assert: the check and the append are one step under the ledger's lock.
    assert sorted(queue.get(timeout=5) for _ in workers) == ["admitted", "refused"]
    ((_, entries),) = PrivacyLedger().sets()
    assert len(entries) == 1


def test_row_limits_of_64_records_and_more_are_linked(tmp_path):
    open_release(tmp_path / "head", labels=LabelRecords(IDS[:100], Y[:100]))
    with pytest.raises(PrivacyError, match="released 1 time"):
        open_release(tmp_path / "all")
    with pytest.raises(PrivacyError, match="released 1 time"):
        open_release(tmp_path / "other", labels=LabelRecords(IDS[:70], Y[:70]))


def test_a_data_file_with_fewer_than_64_labelled_rows_is_refused(tmp_path, criteo_file):
    from tpsl_flwr.errors import ConfigError

    with pytest.raises(ConfigError, match="at least 64"):
        run_experiment(_criteo(tmp_path / "run", criteo_file, rows=50))


def test_a_resume_that_spends_more_is_recorded_for_every_mechanism(tmp_path):
    """The Gaussian resume to more epochs was never recorded (its eps is None)."""
    other = (np.random.default_rng(98).random(N) < 0.3).astype(np.int64)
    cases = (("gaussian", {"sigma": 1.0}, Y), ("laplace", {"epsilon": 1.0}, other))
    for mechanism, params, labels in cases:
        mech = make_mechanism(mechanism, **params)
        binding = NoiseBinding.of(
            mechanism=mech, placement="logits", reuse_noise=False, id_space=SPACE
        )
        for resume, epochs in ((False, 1), (True, 10)):
            LabelStore(tmp_path / mechanism).open_release(
                binding,
                resume=resume,
                labels=LabelRecords(IDS, labels),
                privacy=privacy_spent(mechanism=mech, epochs=epochs, reuse_noise=False),
                public_labels=True,
            )
        ledger = PrivacyLedger()
        label_set = ledger.label_set(IDS, labels, public=True)
        entries = ledger.entries(label_set)
        assert [e.releases for e in entries] == [1, 10]
        ten = privacy_spent(mechanism=mech, epochs=10, reuse_noise=False)
        total = ledger.total(label_set)
        assert total.releases == 1  # one key, at its largest spend
        assert total.epsilon_at_delta == pytest.approx(ten.epsilon_at_delta, rel=1e-3)


def test_an_acknowledgement_is_used_up_by_a_refused_run_and_expires(tmp_path):
    open_release(tmp_path / "a")
    store = LabelStore(tmp_path / "b")
    path = store.acknowledge_new_release(budget=1.5)
    with pytest.raises(PrivacyError, match="above the budget"):
        open_release(tmp_path / "b")
    assert not path.exists()
    with pytest.raises(PrivacyError, match="further release"):
        open_release(tmp_path / "b", epsilon=0.5)
    # An acknowledgement nobody used for a day is dropped, not applied.
    path = store.acknowledge_new_release()
    record = json.loads(path.read_bytes())
    record["written"] -= 25 * 3600
    from tpsl_flwr._util.private_files import write_private

    write_private(path, json.dumps(record).encode())
    with pytest.raises(PrivacyError, match="further release"):
        open_release(tmp_path / "b")


def test_privacy_computed_for_other_settings_than_the_binding_is_refused(tmp_path):
    from tpsl_flwr.errors import ConfigError

    mechanism = make_mechanism("laplace", epsilon=1.0)
    binding = NoiseBinding.of(
        mechanism=mechanism, placement="cut", reuse_noise=True, id_space=SPACE
    )
    with pytest.raises(ConfigError, match="placement 'logits' but the binding"):
        LabelStore(tmp_path / "lp").open_release(
            binding,
            resume=False,
            labels=LabelRecords(IDS, Y),
            privacy=privacy_spent(mechanism=mechanism),  # logits by default
        )
    assert PrivacyLedger().sets() == []


def test_a_strategy_spending_more_than_its_release_recorded_is_refused(tmp_path):
    from tpsl_flwr.release.record import check_spend

    release = open_release(tmp_path / "lp")
    mechanism = make_mechanism("laplace", epsilon=1.0)
    check_spend(release.ledger, privacy_spent(mechanism=mechanism, epochs=5))
    more = privacy_spent(mechanism=mechanism, epochs=5, reuse_noise=False)
    with pytest.raises(PrivacyError, match=r"spends 5 release\(s\) per label"):
        check_spend(release.ledger, more)


def test_a_relative_ledger_folder_is_refused(monkeypatch):
    from tpsl_flwr.release.ledger import LEDGER_ENV, default_ledger_dir

    monkeypatch.setenv(LEDGER_ENV, "ledger")
    with pytest.raises(PrivacyError, match="must be an absolute path"):
        default_ledger_dir()
