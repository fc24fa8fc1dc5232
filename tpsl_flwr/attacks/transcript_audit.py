"""The label party audits its own transcript with the attacker's attacks.

Exactly what left the label party (each non-label party's slice of the
dispatched, perturbed cut-layer gradient, as float32) is kept for one epoch and
scored by :func:`~tpsl_flwr.attacks.report.attack_report`, so the numbers are
the attacker's numbers; the white-box shortest-distance attack also gets the
candidate gradients ``g_j`` of the top model *before* the step (the parameters
the perturbed gradient was computed with). Everything here is derived from
labels and stays with the label party (it goes to its own results file).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from torch import Tensor

from tpsl_flwr.attacks.report import BatchRecord, attack_report
from tpsl_flwr.parties import LabelParty
from tpsl_flwr.privacy.perturb import candidate_gradients


class TranscriptAudit:
    """Collect one epoch of each party's received gradients and attack them.

    Parameters
    ----------
    slices
        ``(offset, width)`` of each non-label party's columns of the cut layer,
        in partition order.
    """

    def __init__(self, slices: Sequence[tuple[int, int]]) -> None:
        self.slices = list(slices)
        self.records: list[list[BatchRecord]] = [[] for _ in self.slices]
        self.seconds = 0.0

    def step(
        self, party: LabelParty, ids: np.ndarray, embeddings: Tensor, epoch: int
    ) -> Tensor:
        """Run ``party.train_step`` and record what it dispatches.

        Returns
        -------
        torch.Tensor
            The dispatched gradient (unchanged).
        """
        started = time.perf_counter()
        candidates = candidate_gradients(party.top, embeddings).numpy()
        spent = time.perf_counter() - started
        dispatched = party.train_step(ids, embeddings, epoch=epoch)
        started = time.perf_counter()
        grad = dispatched.numpy()
        labels = party.labels[ids]
        for records, (offset, width) in zip(self.records, self.slices, strict=True):
            cols = slice(offset, offset + width)
            records.append(
                BatchRecord(
                    ids=np.asarray(ids).copy(),
                    gradient=grad[:, cols].copy(),
                    labels=labels,
                    candidates=candidates[:, :, cols],
                    batch_size=len(ids),
                )
            )
        self.seconds += spent + time.perf_counter() - started
        return dispatched

    def epoch_report(self, auc_bound: float | None) -> dict[str, Any]:
        """The epoch's attack results (party 0's at the top level), then reset.

        Returns
        -------
        dict
            Party 0's report (``norm``, ``cosine``, ``spectral``, ``sda`` AUCs
            for binary labels, or ``sda_top1``; their ``standard_error``, each
            AUC's ``ceiling_verdict`` against ``auc_bound``; ``per_batch``),
            ``auc_bound``, ``by_party`` (every party's report), and
            ``seconds`` spent auditing.
        """
        started = time.perf_counter()
        reports = [
            attack_report(records, auc_bound=auc_bound) for records in self.records
        ]
        self.seconds += time.perf_counter() - started
        out = {
            **reports[0],
            "auc_bound": auc_bound,
            "by_party": reports,
            "seconds": self.seconds,
        }
        self.records = [[] for _ in self.slices]
        self.seconds = 0.0
        return out
