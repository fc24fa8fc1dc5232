"""Forward-embedding clustering (population-level; label DP does not cover it).

Fu et al. 2022, "Label inference attacks against vertical federated learning"
(USENIX Security 2022), and Sun et al. 2021 (arXiv:2112.05409) observe that the
non-label party's own embeddings, once its bottom model is trained, form one
cluster per class. KMeans with two clusters on those embeddings needs no
gradient and no label; the cluster is oriented by size (the smaller one is
label 1, as for imbalanced CTR data) or by one known positive. See
:mod:`tpsl_flwr.attacks.population` for why label DP does not bound it.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike
from sklearn.cluster import KMeans

from tpsl_flwr._util.checks import check_int
from tpsl_flwr.attacks.signals import as_matrix
from tpsl_flwr.errors import ConfigError


def clustering_scores(
    embeddings: ArrayLike,
    positive: int | None = None,
    *,
    seed: int = 0,
    n_init: int = 10,
) -> np.ndarray:
    """Distance to the negative centre minus distance to the positive centre.

    Parameters
    ----------
    embeddings
        ``(n, d)`` the attacker's bottom-model outputs (at least 2 samples).
    positive
        ``None`` (default): the smaller cluster is label 1 (ties: the cluster
        KMeans numbers 1). Otherwise the row index of a sample known to have
        label 1; its cluster is label 1.
    seed
        KMeans' random state.
    n_init
        KMeans restarts.

    Returns
    -------
    numpy.ndarray
        ``(n,)`` scores, high means label 1.

    Raises
    ------
    ConfigError
        Naming the bad value.

    Examples
    --------
    >>> emb = np.array([[0.0], [0.1], [0.2], [5.0]])
    >>> int(np.argmax(clustering_scores(emb)))
    3
    """
    rows = as_matrix(embeddings, "embeddings", min_rows=2)
    seed = check_int(seed, "seed", minimum=0)
    n_init = check_int(n_init, "n_init", minimum=1)
    if positive is not None:
        index = check_int(positive, "positive", minimum=0)
        if index >= rows.shape[0]:
            raise ConfigError(
                f"positive index must be in [0, {rows.shape[0]}), got {positive}"
            )
    kmeans = KMeans(n_clusters=2, n_init=n_init, random_state=seed).fit(rows)
    assigned = np.asarray(kmeans.labels_)
    if positive is not None:
        positive_cluster = int(assigned[index])
    else:
        sizes = np.bincount(assigned, minlength=2)
        positive_cluster = 0 if sizes[0] < sizes[1] else 1
    distances = kmeans.transform(rows)
    return distances[:, 1 - positive_cluster] - distances[:, positive_cluster]
