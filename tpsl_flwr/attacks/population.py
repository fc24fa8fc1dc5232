"""What the population-level attacks share, and why label DP does not stop them.

Label DP (and TPSL's ``(epsilon, 0)`` guarantee) bounds what the transcript
reveals about *each individual label* beyond what could be inferred without
it. It does not stop an attacker from learning the *relationship* between
features and labels: the non-label party's bottom model is trained to make its
embeddings predictive of the label (that is the utility of split learning),
so a small head fitted on a few labelled samples, or a plain clustering of
the embeddings, predicts the labels of everybody else about as well as the
joint model does. Such inference is population-level: it would work equally
well on a sample whose label never entered training. It is therefore not a
violation of label DP, and the attacks of this kind (model completion,
embedding clustering) must be read as a measure of what the model itself
gives away, not of what the gradients leak; their success does not shrink
with epsilon the way the per-label ceiling ``e^eps / (1 + e^eps)`` does.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from tpsl_flwr.errors import ConfigError


def check_known(
    known_index: ArrayLike, known_labels: ArrayLike, rows: int
) -> tuple[np.ndarray, np.ndarray]:
    """Validate the attacker's few labelled samples.

    Parameters
    ----------
    known_index
        ``(m,)`` distinct row indices in ``[0, rows)``.
    known_labels
        ``(m,)`` their labels, integers >= 0 with at least two distinct values.
    rows
        The number of samples being attacked.

    Returns
    -------
    tuple of numpy.ndarray
        The indices and labels as int64 arrays.

    Raises
    ------
    ConfigError
        Naming the bad value.
    """
    index = np.asarray(known_index)
    labels = np.asarray(known_labels)
    if index.ndim != 1 or labels.shape != index.shape:
        raise ConfigError(
            f"known_index and known_labels must be 1-D of one length, got shapes "
            f"{index.shape} and {labels.shape}"
        )
    for name, values in (("known_index", index), ("known_labels", labels)):
        if values.size and not np.issubdtype(values.dtype, np.integer):
            raise ConfigError(f"{name} must hold integers, got dtype {values.dtype}")
    index = index.astype(np.int64)
    labels = labels.astype(np.int64)
    if index.size and (index.min() < 0 or index.max() >= rows):
        raise ConfigError(
            f"known_index must lie in [0, {rows}), got values from {index.min()} "
            f"to {index.max()}"
        )
    if np.unique(index).size != index.size:
        raise ConfigError("known_index holds a sample more than once")
    if labels.size and labels.min() < 0:
        raise ConfigError(f"known_labels must be >= 0, got {labels.min()}")
    if np.unique(labels).size < 2:
        raise ConfigError(
            f"known_labels must hold at least two classes, got {np.unique(labels)}"
        )
    return index, labels
