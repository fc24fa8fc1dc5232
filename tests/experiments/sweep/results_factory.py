"""Sweep results as a run writes them, made up with known values (no training).

Each run has two epochs whose values differ (epoch 1 is the best), the
standard errors an attack report carries, and the privacy block of its
mechanism, so the report's choices (epoch, error bars, guarantee) can be
read back exactly.
"""

import json
from pathlib import Path

from tpsl_flwr.privacy.closed_forms import auc_bound

DATA_INFO = {
    "rows": 2000,
    "num_classes": 2,
    "positive_rate": 0.25,
    "num_numeric": 13,
    "num_categorical": 26,
    "test_rows": 400,
    "test_positive_rate": 0.25,
}
SETTINGS = {"epochs": 2, "batch-size": 128, "lr": 0.0, "placement": "logits"}


def results(
    mechanism,
    seed,
    *,
    epsilon=None,
    sigma=None,
    marvell_power=None,
    utility=0.75,
    sda=0.7,
    best_epoch=1,
    direction=None,
    settings=None,
    data_info=None,
):
    """One run's ``results.json`` content; epoch 2 is worse by 0.05 (utility).

    The attack AUCs grow with the seed (0.01 a seed for NA and SDA, 0.02 for
    SA) so that seeds spread.
    """
    config = {
        "dataset": "criteo",
        "data-path": f"/data/{seed}/criteo.txt",
        "rows": 0,
        "mechanism": mechanism,
        "epsilon": 1.0 if epsilon is None else epsilon,
        "sigma": 1.0 if sigma is None else sigma,
        "seed": seed,
        "denoise": "none",
        "out-dir": f"runs/{mechanism}_{seed}",
        **SETTINGS,
        **(settings or {}),
    }
    if marvell_power is not None:
        config["marvell-power"] = marvell_power
    history = []
    for epoch in (1, 2):
        worse = 0.05 * (epoch - 1)
        attacks = {
            "norm": 0.55 + 0.01 * seed,
            "spectral": 0.6 + 0.02 * seed,
            "cosine": 0.5,
            "sda": sda - worse / 5 + 0.01 * seed,
            "standard_error": {"norm": 0.02, "spectral": 0.02, "sda": 0.015},
            "auc_bound": None if epsilon is None else auc_bound(epsilon),
        }
        if direction:
            attacks["direction"] = direction
        history.append(
            {"epoch": epoch, "test_auc": utility - worse, "attack_auc": attacks}
        )
    privacy = {"epsilon": epsilon, "epsilon_at_delta": epsilon, "delta": 1e-5}
    if sigma is not None:
        privacy = {"epsilon": None, "epsilon_at_delta": 4.0 / sigma, "delta": 1e-5}
    if mechanism == "none" or marvell_power is not None:
        privacy = {"epsilon": None, "epsilon_at_delta": None, "delta": 1e-5}
    return {
        "mechanism": mechanism,
        "epsilon": epsilon,
        "sigma": sigma,
        "marvell_power": marvell_power,
        "dataset": "criteo",
        "config": config,
        "history": history,
        "best_epoch": best_epoch,
        "privacy": privacy,
        "data_info": {**DATA_INFO, **(data_info or {})},
        "noise_key": {"origin": "os", "secure": True},
        "run_kind": "rehearsal",
        "test_auc": history[best_epoch - 1]["test_auc"],
    }


def grid(seeds=(0, 1), **changes):
    """Named results of a small grid: none, laplace, discrete, gaussian."""
    runs = {}
    for seed in seeds:
        runs[f"criteo_none_seed{seed}"] = results(
            "none", seed, utility=0.80 + 0.01 * seed, sda=0.98, **changes
        )
        for eps, utility, sda in ((1.0, 0.70, 0.70), (4.0, 0.78, 0.95)):
            runs[f"criteo_laplace_eps{eps:g}_seed{seed}"] = results(
                "laplace",
                seed,
                epsilon=eps,
                utility=utility + 0.01 * seed,
                sda=sda,
                **changes,
            )
        runs[f"criteo_discrete_eps1_seed{seed}"] = results(
            "discrete",
            seed,
            epsilon=1.0,
            utility=0.69 + 0.01 * seed,
            sda=0.73,
            **changes,
        )
        runs[f"criteo_gaussian_sigma2_seed{seed}"] = results(
            "gaussian",
            seed,
            sigma=2.0,
            utility=0.74 + 0.01 * seed,
            sda=0.8,
            **changes,
        )
    return runs


def write_sweep(folder, runs):
    """A sweep folder: ``runs/<name>/results.json`` and a ``runs.csv``."""
    folder = Path(folder)
    for name, content in runs.items():
        run = folder / "runs" / name
        run.mkdir(parents=True, exist_ok=True)
        (run / "results.json").write_text(json.dumps(content))
    (folder / "runs.csv").write_text("run\n" + "".join(f"{n}\n" for n in runs))
    return folder
