"""The deployment engine passes the run config's paths on as flower-run does."""

import os
from pathlib import Path

from tpsl_flwr.experiments.ray_run import absolute_paths
from tpsl_flwr.experiments.run import _absolute_paths


def test_paths_are_absolute_with_home_expanded_and_others_untouched(monkeypatch):
    monkeypatch.setenv("HOME", "/home/someone")
    config = {
        "out-dir": "~/runs/a",
        "data-path": "data/train.txt",
        "label-dir": "",
        "epochs": 2,
    }
    found = _absolute_paths(config)
    assert found["out-dir"] == str(Path("/home/someone/runs/a").resolve())
    assert found["data-path"] == os.path.join(os.getcwd(), "data", "train.txt")
    assert found["label-dir"] == "" and found["epochs"] == 2
    # one rule with tpsl-flwr flower-run
    assert {**config, **absolute_paths(config, {})} == found
