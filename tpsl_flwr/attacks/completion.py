"""The model-completion attack (population-level; label DP does not cover it).

Fu et al. 2022, "Label inference attacks against vertical federated learning"
(USENIX Security 2022), Section 4 (passive model completion): the attacker
completes its trained bottom model with a small head of its own, fitted on a
few dozen samples whose labels it knows, and labels everybody else. Fu et al.
fine-tune the bottom model semi-supervised (MixMatch); here the bottom model
is frozen and only the head is fitted on its embeddings (a logistic
regression or a small MLP), the simplest form of the attack. It uses no
gradient at all, so it measures what the trained model gives away; see
:mod:`tpsl_flwr.attacks.population` for why label DP does not bound it.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike
from sklearn.linear_model import LogisticRegression
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

from tpsl_flwr._util.checks import check_int
from tpsl_flwr.attacks.population import check_known
from tpsl_flwr.attacks.signals import as_matrix
from tpsl_flwr.errors import ConfigError

HEADS = ("logistic", "mlp")
"""The heads the attacker may fit."""


def _head(head: str, seed: int) -> Pipeline:
    if head == "logistic":
        model: LogisticRegression | MLPClassifier = LogisticRegression(max_iter=1000)
    elif head == "mlp":
        model = MLPClassifier(
            hidden_layer_sizes=(32,), max_iter=2000, random_state=seed
        )
    else:
        raise ConfigError(f"head must be one of {HEADS}, got {head!r}")
    return make_pipeline(StandardScaler(), model)


def model_completion_probabilities(
    embeddings: ArrayLike,
    known_index: ArrayLike,
    known_labels: ArrayLike,
    *,
    classes: int | None = None,
    head: str = "logistic",
    seed: int = 0,
) -> np.ndarray:
    """Class probabilities of every sample from a head fitted on a few labels.

    Parameters
    ----------
    embeddings
        ``(n, d)`` the attacker's own bottom-model outputs for all samples.
    known_index
        ``(m,)`` rows whose labels the attacker knows (a few dozen suffice).
    known_labels
        ``(m,)`` those labels, at least two classes.
    classes
        Number of classes ``k``; ``max(known_labels) + 1`` by default.
    head
        ``"logistic"`` (default) or ``"mlp"`` (one hidden layer of 32).
    seed
        Seed of the MLP's initialisation.

    Returns
    -------
    numpy.ndarray
        ``(n, k)`` probabilities; a class absent from the known labels gets 0.

    Raises
    ------
    ConfigError
        Naming the bad value.

    Examples
    --------
    >>> emb = np.array([[0.0], [0.1], [0.9], [1.0]])
    >>> p = model_completion_probabilities(emb, [0, 3], [0, 1])
    >>> bool(p[2, 1] > p[1, 1])
    True
    """
    rows = as_matrix(embeddings, "embeddings")
    index, labels = check_known(known_index, known_labels, rows.shape[0])
    k = int(labels.max()) + 1 if classes is None else check_int(classes, "classes", 2)
    if labels.max() >= k:
        raise ConfigError(f"known_labels must be < classes = {k}, got {labels.max()}")
    model = _head(head, check_int(seed, "seed", minimum=0))
    model.fit(rows[index], labels)
    out = np.zeros((rows.shape[0], k))
    out[:, model.classes_] = model.predict_proba(rows)
    return out


def model_completion_scores(
    embeddings: ArrayLike,
    known_index: ArrayLike,
    known_labels: ArrayLike,
    *,
    head: str = "logistic",
    seed: int = 0,
) -> np.ndarray:
    """Binary model completion: the fitted head's probability of label 1.

    Parameters
    ----------
    embeddings
        ``(n, d)`` the attacker's own bottom-model outputs for all samples.
    known_index
        ``(m,)`` rows whose labels the attacker knows.
    known_labels
        ``(m,)`` those labels, 0 or 1, both present.
    head
        ``"logistic"`` (default) or ``"mlp"``.
    seed
        Seed of the MLP's initialisation.

    Returns
    -------
    numpy.ndarray
        ``(n,)`` scores, high means label 1.

    Raises
    ------
    ConfigError
        Naming the bad value (a known label other than 0 or 1 included).
    """
    probabilities = model_completion_probabilities(
        embeddings, known_index, known_labels, classes=2, head=head, seed=seed
    )
    return probabilities[:, 1]
