"""glibc allocator tuning (engines.allocator): choice, refusals, effect."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tpsl_flwr._util.allocator import allocator_choice, tune_allocator


def _is_glibc() -> bool:
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (ValueError, OSError, AttributeError):
        return False


def test_opt_in_and_the_users_own_glibc_settings_win() -> None:
    # Prepare
    lean = {"TPSL_FLWR_MALLOC": "lean"}
    # Execute / Assert
    assert allocator_choice({}) == "TPSL_FLWR_MALLOC"
    assert allocator_choice({"TPSL_FLWR_MALLOC": "glibc"}) == "TPSL_FLWR_MALLOC"
    assert allocator_choice(lean) is None
    assert allocator_choice(lean | {"MALLOC_MMAP_THRESHOLD_": "65536"}) == (
        "MALLOC_MMAP_THRESHOLD_"
    )
    assert allocator_choice(
        lean | {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}
    ) == ("GLIBC_TUNABLES")
    assert tune_allocator(environ={}) is False
    assert tune_allocator(environ={"TPSL_FLWR_MALLOC": "glibc"}) is False


def test_bad_values_are_refused_by_name() -> None:
    with pytest.raises(
        ValueError, match=r"TPSL_FLWR_MALLOC must be 'lean' or 'glibc', got 'jemalloc'"
    ):
        tune_allocator(environ={"TPSL_FLWR_MALLOC": "jemalloc"})
    with pytest.raises(ValueError, match=r"mmap_threshold must be .* got -1"):
        tune_allocator(mmap_threshold=-1)
    with pytest.raises(ValueError, match=r"mmap_threshold must be .* got 67108864"):
        tune_allocator(mmap_threshold=64 << 20)
    with pytest.raises(ValueError, match=r"trim_threshold must be >= 0, got -5"):
        tune_allocator(trim_threshold=-5)


# A 4 MiB block freed raises glibc's dynamic mmap threshold to 4 MiB, so a later
# 2 MiB block comes from the heap and stays resident when freed; with the fixed
# 1 MiB threshold it is mapped on its own (mallinfo2's hblkhd grows).
_PROBE = """
import ctypes, sys
from tpsl_flwr._util.allocator import tune_allocator
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks "
        "keepcost").split()]
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
libc.mallinfo2.restype = Info
print(tune_allocator(mmap_threshold=1 << 20))
libc.free(libc.malloc(4 << 20))
before = libc.mallinfo2().hblkhd
block = libc.malloc(2 << 20)
print(libc.mallinfo2().hblkhd - before >= 2 << 20)
libc.free(block)
"""


@pytest.mark.skipif(not _is_glibc(), reason="mallopt's settings are glibc's")
@pytest.mark.parametrize(
    ("choice", "expected"), [("lean", ["True", "True"]), ("glibc", ["False", "False"])]
)
def test_a_large_block_is_mapped_only_when_tuned(
    choice: str, expected: list[str]
) -> None:
    # Prepare
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")
    }
    env["TPSL_FLWR_MALLOC"] = choice
    # Execute
    out = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    # Assert
    assert out.stdout.split() == expected


def test_the_local_engine_asks_at_its_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare
    from tpsl_flwr._util import allocator
    from tpsl_flwr.experiments.config import ExperimentConfig
    from tpsl_flwr.experiments.run import run_experiment

    calls: list[dict[str, object]] = []
    monkeypatch.setattr(allocator, "tune_allocator", lambda **kw: calls.append(kw))
    cfg = ExperimentConfig(
        dataset="breast-cancer", epochs=1, noise_seed=0, out_dir=str(tmp_path / "run")
    )
    # Execute
    results = run_experiment(cfg)
    # Assert: once, with the module's thresholds (the environment decides)
    assert calls == [{}]
    assert results["engine"] == "local"
