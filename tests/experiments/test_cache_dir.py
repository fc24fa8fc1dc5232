"""``cache-dir``: the encoded-file cache goes where the user says, never beside
a data file that sits on a read-only mount.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tpsl_flwr._util import private_files
from tpsl_flwr.errors import ConfigError, PrivacyError
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.run import run_inprocess_experiment
from tpsl_flwr.testing import write_criteo


@pytest.fixture(scope="module")
def data_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding only a generated 1200-row Criteo file."""
    folder = tmp_path_factory.mktemp("data")
    write_criteo(folder / "train.txt", 1200, seed=5)
    return folder


def _config(data_folder: Path, tmp_path: Path, **fields: object) -> ExperimentConfig:
    base: dict[str, object] = {
        "dataset": "criteo",
        "data_path": str(data_folder / "train.txt"),
        "epochs": 1,
        "out_dir": str(tmp_path / "out"),
        "noise_seed": 0,
    }
    return ExperimentConfig(**{**base, **fields})  # type: ignore[arg-type]


def test_a_run_writes_its_cache_in_cache_dir_and_nothing_beside_the_file(
    data_folder: Path, tmp_path: Path
) -> None:
    # Arrange
    cache = tmp_path / "cache"
    cfg = _config(data_folder, tmp_path, cache_dir=str(cache))

    # Execute
    results, _ = run_inprocess_experiment(cfg)

    # Assert: the label party's and the nodes' loads used the folder given
    assert sorted(p.name for p in data_folder.iterdir()) == ["train.txt"]
    assert any(cache.rglob("*.npy")), "no encoded arrays in cache-dir"
    assert 0.0 <= results["test_auc"] <= 1.0


def test_the_default_still_caches_beside_the_file(
    data_folder: Path, tmp_path: Path
) -> None:
    # Arrange: a copy of the data folder, so the module's folder stays clean
    folder = tmp_path / "beside"
    shutil.copytree(data_folder, folder)
    cfg = _config(folder, tmp_path)

    # Execute
    cfg.load_labels()

    # Assert
    assert (folder / ".tpsl-cache").is_dir()


def test_cache_dir_of_a_built_in_dataset_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cache-dir applies only to .*'/x'"):
        ExperimentConfig(dataset="digits", cache_dir="/x", out_dir=str(tmp_path))


def test_cache_dir_must_be_a_string(data_folder: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cache-dir must be a string, got 3"):
        _config(data_folder, tmp_path, cache_dir=3)


_LOAD_EVERY_VIEW = """
import json, sys
from tpsl_flwr.experiments.config import ExperimentConfig
cfg = ExperimentConfig(dataset="criteo", data_path=sys.argv[1], cache_dir=sys.argv[2],
                       out_dir=sys.argv[3], noise_seed=0)
labels = cfg.load_labels()
party = cfg.load_party(0)
table = cfg.load_data()
print(json.dumps([len(labels.train_ids), len(party.train_ids), len(table.train_ids)]))
"""


def _read_only_command(folder: Path, argv: list[str]) -> list[str]:
    """``argv`` with ``folder`` mounted read-only (root: a private bind mount)."""
    if os.geteuid() != 0:
        return argv  # the folder is made read-only with chmod instead
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        pytest.skip("root without unshare/mount: cannot mount a folder read-only")
    quoted = " ".join(f"'{a}'" for a in argv)
    mount = f"mount --bind '{folder}' '{folder}' && mount -o remount,bind,ro '{folder}'"
    return ["unshare", "--mount", "sh", "-c", f"{mount} && exec {quoted}"]


def test_every_view_loads_from_a_read_only_data_mount(
    data_folder: Path, tmp_path: Path
) -> None:
    # Arrange: the data folder read-only for the loading process
    folder = tmp_path / "ro"
    shutil.copytree(data_folder, folder)
    cache = tmp_path / "cache"
    argv = [sys.executable, "-c", _LOAD_EVERY_VIEW]
    argv += [str(folder / "train.txt"), str(cache), str(tmp_path / "out")]
    command = _read_only_command(folder, argv)
    if os.geteuid() != 0:
        folder.chmod(0o555)
    probe = _read_only_command(folder, ["touch", str(folder / "probe")])

    # Execute
    try:
        writable = subprocess.run(probe, capture_output=True).returncode == 0
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    finally:
        folder.chmod(0o755)

    # Assert: the mount really was read-only, and every view loaded
    assert not writable, "the data folder was writable: the test proves nothing"
    assert done.returncode == 0, done.stderr[-2000:]
    label_rows, party_rows, table_rows = json.loads(done.stdout)
    assert label_rows == party_rows == table_rows > 0
    assert sorted(p.name for p in folder.iterdir()) == ["train.txt"]
    assert any(cache.rglob("*.npy"))


def _plant(data_folder: Path, tmp_path: Path, mode: int) -> tuple[Path, Path]:
    """A cache-dir holding a label-side entry planted with every label flipped.

    Anyone who can stat the data file can name its cache entry (the key is a
    hash of its path, size, modification time and the encoding's settings);
    here the planted entry is this user's own load, copied and edited.
    """
    own = tmp_path / "own"
    _config(data_folder, tmp_path, cache_dir=str(own)).load_labels()
    (entry,) = [p for p in own.iterdir() if (p / "labels.npy").exists()]
    shared = tmp_path / "shared"
    shared.mkdir()
    planted = shared / entry.name
    shutil.copytree(entry, planted)
    labels = np.load(planted / "labels.npy")
    np.save(planted / "labels.npy", (1 - labels).astype(labels.dtype))
    for item in planted.iterdir():
        item.chmod(mode & 0o666)
    planted.chmod(mode)
    return shared, planted


def test_a_label_entry_others_may_write_is_refused_not_trusted(
    data_folder: Path, tmp_path: Path
) -> None:
    # Arrange: an entry in a shared cache-dir that group and others may write
    shared, planted = _plant(data_folder, tmp_path, 0o777)
    cfg = _config(data_folder, tmp_path, cache_dir=str(shared))

    # Execute / Assert: the label party refuses it rather than train on it
    with pytest.raises(PrivacyError, match=str(planted)):
        cfg.load_labels()


def test_a_label_entry_another_user_owns_is_refused_not_trusted(
    data_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Arrange: a private-looking entry whose owner is not this user
    shared, planted = _plant(data_folder, tmp_path, 0o700)
    owner = planted.stat().st_uid
    monkeypatch.setattr(private_files.os, "getuid", lambda: owner + 1)
    cfg = _config(data_folder, tmp_path, cache_dir=str(shared))

    # Execute / Assert
    with pytest.raises(PrivacyError, match=f"owned by uid {owner}"):
        cfg.load_labels()


def test_a_node_entry_others_may_write_is_refused_too(
    data_folder: Path, tmp_path: Path
) -> None:
    # Arrange: this user's own node-side entry, then opened up to everyone
    cache = tmp_path / "cache"
    cfg = _config(data_folder, tmp_path, cache_dir=str(cache))
    cfg.load_party(0)
    (entry,) = list(cache.iterdir())
    entry.chmod(0o777)

    # Execute / Assert: a second process (a fresh view cache) refuses it
    done = subprocess.run(
        [sys.executable, "-c", _LOAD_EVERY_VIEW, cfg.data_path, str(cache), "x"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and str(entry) in done.stderr
