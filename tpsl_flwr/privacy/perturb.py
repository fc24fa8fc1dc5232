"""Applying GradPerturb to a torch top model, at the logits or the cut layer.

Every mechanism's output is ``sum_j c_j g_j`` (plus ``r`` for the Gaussian
baseline), where ``g_j`` is the gradient of the loss for label ``j``. Since the
gradient of ``sum_i sum_j c_ij l(z_i, j)`` with respect to a sample's embedding
or logits is exactly ``sum_j c_ij g_ij``, one backward pass of this
*coefficient-weighted loss* produces GradPerturb's output for the whole batch,
for any loss, without ``k`` separate backward passes.

* ``logits`` (Yang et al., Section 4.2): one noisy ``c`` per sample; a single
  backward pass gives both the top-model update and the cut-layer gradient
  sent to the non-label parties. The run is ``(epsilon, 0)``-DP.
* ``cut`` (Algorithm 3 as stated): the cut-layer gradient uses ``c`` and the
  top-model update an independently drawn ``c'``: ``(2 epsilon, 0)``-DP.

Gradients are per-sample quantities divided by the batch size (the mean loss),
and the noise is in per-sample units before that division.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from tpsl_flwr._util.finite import all_finite
from tpsl_flwr.errors import PrivacyError
from tpsl_flwr.privacy.noisy_labels import NoisyLabels


def per_class_losses(logits: Tensor) -> Tensor:
    """The loss of each sample under each hypothetical label, ``(n, k)``.

    One logit column means sigmoid + binary cross-entropy (``l(z, 0) =
    softplus(z)``, ``l(z, 1) = softplus(-z)``); ``k >= 2`` columns mean softmax
    cross-entropy (``l(z, j) = -log softmax(z)_j``).
    """
    if logits.ndim != 2:
        raise PrivacyError(
            f"logits must be 2-D (n, outputs), got {tuple(logits.shape)}"
        )
    if logits.shape[1] == 1:
        z = logits[:, 0]
        return torch.stack([F.softplus(z), F.softplus(-z)], dim=1)
    return -F.log_softmax(logits, dim=1)


def coefficient_loss(
    logits: Tensor, noisy: NoisyLabels, additive_on: Tensor | None = None
) -> Tensor:
    """The coefficient-weighted loss whose gradient is GradPerturb's output.

    Parameters
    ----------
    logits
        ``(n, outputs)`` top-model outputs.
    noisy
        The batch's randomized labels.
    additive_on
        The tensor the Gaussian noise is added to the gradient of (the logits
        by default; the cut-layer embeddings for the cut placement).

    Returns
    -------
    torch.Tensor
        A scalar: ``(1/n) sum_i [sum_j c_ij l(z_i, j) + <r_i, a_i>]``.

    Raises
    ------
    PrivacyError
        If the coefficients or noise do not fit the batch or are not finite
        (fail closed: never fall back to unperturbed gradients).
    """
    losses = per_class_losses(logits)
    coefficients = torch.as_tensor(noisy.coefficients, dtype=logits.dtype)
    if coefficients.shape != losses.shape:
        raise PrivacyError(
            f"noisy label coefficients of shape {tuple(coefficients.shape)} do not "
            f"fit a batch of losses of shape {tuple(losses.shape)}"
        )
    if not all_finite(coefficients):
        raise PrivacyError("noisy label coefficients are not finite")
    batch = logits.shape[0]
    loss = (coefficients * losses).sum() / batch
    if noisy.additive is not None:
        target = logits if additive_on is None else additive_on
        noise = torch.as_tensor(noisy.additive, dtype=target.dtype)
        if noise.shape != target.shape or not all_finite(noise):
            raise PrivacyError(
                f"Gaussian noise of shape {tuple(noise.shape)} does not fit "
                f"{tuple(target.shape)} or is not finite"
            )
        loss = loss + (noise * target).sum() / batch
    return loss


Denoiser = Callable[[Tensor, NoisyLabels], NoisyLabels]
"""Maps (detached logits, noisy labels) to the labels trained on (a posterior)."""


def logits_placement_backward(
    top: nn.Module,
    embeddings: Tensor,
    noisy: NoisyLabels,
    *,
    denoise: Denoiser | None = None,
    dispatch: NoisyLabels | None = None,
) -> tuple[Tensor, Tensor]:
    """One backward pass with the noise at the logits (Section 4.2).

    Accumulates the top model's perturbed update into its ``.grad`` fields.

    Parameters
    ----------
    top
        The label party's top model.
    embeddings
        ``(n, d)`` cut-layer embeddings received from the non-label parties.
    noisy
        The batch's randomized labels (drawn once per sample).
    denoise
        If given, called with the detached logits of this forward pass and
        ``noisy``; the top model's update comes from its result instead
        (noise-aware training, :mod:`tpsl_flwr.privacy.posterior`).
    dispatch
        The labels the dispatched gradient is computed from (default
        ``noisy``); with ``denoise``, the label party passes the release's
        unbiased coefficients, so what leaves it is GradPerturb's gradient of
        the release alone, not of the posterior.

    Returns
    -------
    tuple of torch.Tensor
        The perturbed cut-layer gradient ``(n, d)`` to dispatch, and the
        logits (detached) for bookkeeping.
    """
    cut = embeddings.detach().requires_grad_(True)
    logits = top(cut)
    if denoise is None and dispatch is None:
        coefficient_loss(logits, noisy).backward()
        assert cut.grad is not None
        return cut.grad.detach(), logits.detach()
    sent = coefficient_loss(logits, noisy if dispatch is None else dispatch)
    (cut_grad,) = torch.autograd.grad(sent, cut, retain_graph=True)
    trained = noisy if denoise is None else denoise(logits.detach(), noisy)
    _accumulate(top, coefficient_loss(logits, trained))
    return cut_grad.detach(), logits.detach()


def _accumulate(top: nn.Module, loss: Tensor) -> None:
    """Add ``loss``'s gradient to the top model's ``.grad`` fields (only theirs)."""
    params = [p for p in top.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    for param, grad in zip(params, grads, strict=True):
        if grad is None:
            continue
        param.grad = grad.detach() if param.grad is None else param.grad + grad


def cut_placement_backward(
    top: nn.Module,
    embeddings: Tensor,
    transcript_noisy: NoisyLabels,
    update_noisy: NoisyLabels,
    *,
    denoise: Denoiser | None = None,
    dispatch: NoisyLabels | None = None,
) -> tuple[Tensor, Tensor]:
    """Perturb the cut-layer gradient and the top update separately (Algorithm 3).

    Parameters
    ----------
    top
        The label party's top model.
    embeddings
        ``(n, d)`` cut-layer embeddings.
    transcript_noisy
        Randomized labels behind the dispatched gradient (for the Gaussian
        baseline its noise has the cut-layer width ``d``).
    update_noisy
        Independently randomized labels behind the top-model update.
    denoise
        As in :func:`logits_placement_backward`: applied to ``update_noisy``.
    dispatch
        The labels the dispatched gradient is computed from (default
        ``transcript_noisy``), as in :func:`logits_placement_backward`.

    Returns
    -------
    tuple of torch.Tensor
        The perturbed cut-layer gradient ``(n, d)`` and the detached logits.
    """
    cut = embeddings.detach().requires_grad_(True)
    logits = top(cut)
    if denoise is not None:
        update_noisy = denoise(logits.detach(), update_noisy)
    sent = transcript_noisy if dispatch is None else dispatch
    transcript_loss = coefficient_loss(logits, sent, additive_on=cut)
    (cut_grad,) = torch.autograd.grad(transcript_loss, cut, retain_graph=True)
    _accumulate(top, coefficient_loss(logits, update_noisy))
    return cut_grad.detach(), logits.detach()


def candidate_gradients(top: nn.Module, embeddings: Tensor) -> Tensor:
    """The per-class cut-layer gradients ``g_j`` of each sample, ``(n, k, d)``.

    ``g_ij = d l(h(e_i), j) / d e_i`` (no batch averaging): what a white-box
    attacker computes (Section 3.1) and what tests compare GradPerturb
    against. The ``k`` vector-Jacobian products run as one batched backward
    pass (``is_grads_batched``).
    """
    cut = embeddings.detach().requires_grad_(True)
    losses = per_class_losses(top(cut))
    n, k = losses.shape
    # Row j of the batch of output gradients selects class j's loss everywhere.
    selectors = torch.eye(k, dtype=losses.dtype)[:, None, :].expand(k, n, k)
    (grads,) = torch.autograd.grad(
        losses, cut, grad_outputs=selectors, is_grads_batched=True
    )
    return grads.transpose(0, 1).detach()
