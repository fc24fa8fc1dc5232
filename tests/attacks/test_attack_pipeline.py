"""In-training attack numbers equal the offline attacker's on the same transcript."""

import json

import numpy as np
import pytest

from tpsl_flwr.cli.main import main
from tpsl_flwr.wire.recorder import score_recorded_transcript


@pytest.mark.parametrize("mechanism", ["none", "laplace"])
def test_in_training_audit_equals_the_offline_attacker(tmp_path, mechanism, capsys):
    # Execute: a run whose nodes record what they receive.
    transcript = tmp_path / "transcript"
    code = main(
        [
            "simulate",
            "--dataset",
            "breast-cancer",
            "--epochs",
            "2",
            "--mechanism",
            mechanism,
            "--noise-seed",
            "4",
            "--out-dir",
            str(tmp_path),
            "--transcript-dir",
            str(transcript),
        ]
    )
    assert code == 0
    results = json.loads((tmp_path / "results.json").read_text())
    labels = np.load(results["evaluation_labels"])
    # Assert: the attacker's own scoring of its own files gives the same AUCs.
    for partition in (0, 1):
        offline = score_recorded_transcript(transcript, labels, partition)
        assert sorted(offline) == [0, 1]
        for epoch, report in offline.items():
            audited = results["history"][epoch]["attack_auc"]["by_party"][partition]
            for name in ("norm", "cosine", "spectral"):
                assert report[name] == audited[name]
                assert report["per_batch"][name] == audited["per_batch"][name]
    if mechanism == "none":
        assert results["history"][-1]["attack_auc"]["sda"] == 1.0
    capsys.readouterr()
    assert (
        main(["attack", str(transcript), "--labels", results["evaluation_labels"]]) == 0
    )
    assert "epoch 2: norm" in capsys.readouterr().out


def test_attack_auc_is_in_every_epoch_with_its_ceiling(tmp_path):
    main(
        [
            "simulate",
            "--dataset",
            "breast-cancer",
            "--epochs",
            "1",
            "--mechanism",
            "discrete",
            "--epsilon",
            "1",
            "--denoise",
            "none",
            "--noise-seed",
            "2",
            "--out-dir",
            str(tmp_path),
        ]
    )
    attack = json.loads((tmp_path / "results.json").read_text())["history"][0][
        "attack_auc"
    ]
    assert attack["auc_bound"] == pytest.approx(0.7311, abs=1e-4)
    assert set(attack) >= {"norm", "cosine", "spectral", "sda", "per_batch", "seconds"}
    # 456 samples: the SDA AUC's standard error is ~0.023; 4 SE above the ceiling.
    assert attack["sda"] < 0.7311 + 0.1
    report = (tmp_path / "report.md").read_text()
    assert "| epoch | test_auc | norm | cosine | spectral | sda | ceiling |" in report
    assert "| 1 | " in report and "0.7311 |" in report
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_gaussian_attack_auc_falls_as_sigma_grows(tmp_path):
    sda = []
    for sigma in ("0.25", "1", "4"):
        out = tmp_path / sigma
        main(
            [
                "simulate",
                "--dataset",
                "breast-cancer",
                "--epochs",
                "1",
                "--mechanism",
                "gaussian",
                "--sigma",
                sigma,
                "--validation-fraction",
                "0",
                "--noise-seed",
                "1",
                "--out-dir",
                str(out),
            ]
        )
        history = json.loads((out / "results.json").read_text())["history"]
        sda.append(history[0]["attack_auc"]["sda"])
    # Closed forms at one logit: 0.9977, 0.7602, 0.5702; 456 samples (SE <= 0.03).
    assert sda[0] > 0.95 and sda[2] < 0.7
    assert sda[0] > sda[1] > sda[2]
