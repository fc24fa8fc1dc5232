"""P_L, the label party, as plain torch: labels, top model, mechanism, noise key.

Given the non-label parties' embeddings for a batch of sample ids, it runs
GradPerturb, updates the top model ``h`` with the *perturbed* signal and returns
the perturbed cut-layer gradient: the only label-derived thing that ever
leaves it (Yang et al., Algorithm 3 and Section 4.2).
"""

from __future__ import annotations

import copy
import secrets
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from tpsl_flwr._util.checks import check_labels, check_placement, check_sample_ids
from tpsl_flwr._util.compact_ints import label_dtype
from tpsl_flwr._util.finite import all_finite
from tpsl_flwr.errors import ConfigError, PrivacyError
from tpsl_flwr.parties.model_state import load_checkpoint_state
from tpsl_flwr.parties.optim import OptimizerFactory, adam
from tpsl_flwr.privacy.gradient_noise import gradient_noise_stream, perturb_gradients
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms import Mechanism
from tpsl_flwr.privacy.mechanisms.base import BatchReference, one_hot
from tpsl_flwr.privacy.noisy_labels import (
    STREAM_CUT_GAUSSIAN,
    STREAM_TOP_UPDATE,
    STREAM_TRANSCRIPT,
    NoisyLabels,
    draw_noisy_labels,
)
from tpsl_flwr.privacy.perturb import (
    Denoiser,
    cut_placement_backward,
    logits_placement_backward,
)
from tpsl_flwr.privacy.posterior import (
    DENOISE_PRIORS,
    DENOISERS,
    check_denoisable,
    frequency_prior,
    posterior_coefficients,
    prior_from_mean,
    unbiased_coefficients,
)
from tpsl_flwr.release.binding import check_bound

_STREAMS_PER_EPOCH = 4
MODEL_PRIOR_CLIP = 1e-6
"""The model prior's probabilities are clipped to ``[c, 1 - c]``."""
_PRIOR_CHUNK = 1 << 16
PREDICT_CHUNK_ROWS = 1 << 13
"""Rows per forward pass of :meth:`LabelParty.predict`."""
RR_PRIOR_FIRST_STAGE = 0.5
"""RR-with-prior: the share of the trained ids randomized with a uniform prior
before the top model is frozen as the prior of the rest (LP-2ST's split)."""
NOISE_CACHE_BYTES = 256 * 2**20
"""Most memory :class:`LabelParty` spends on precomputed per-sample noise."""


def model_prior(logits: Tensor) -> np.ndarray:
    """The top model's class probabilities ``(n, k)`` as a prior, clipped.

    Sigmoid of one logit (binary) or softmax of ``k``, in float64, clipped to
    ``[MODEL_PRIOR_CLIP, 1 - MODEL_PRIOR_CLIP]`` so no class is ruled out.
    """
    z = logits.detach().to(torch.float64)
    if z.shape[1] == 1:
        positive = torch.sigmoid(z[:, 0])
        probs = torch.stack([1 - positive, positive], dim=1)
    else:
        probs = torch.softmax(z, dim=1)
    return probs.clamp(MODEL_PRIOR_CLIP, 1 - MODEL_PRIOR_CLIP).numpy()


def noise_stream(base: int, epoch: int, reuse_noise: bool) -> int:
    """The keyed-noise stream of ``base`` in ``epoch``.

    With reuse (the paper's multi-epoch rule) every epoch uses the same stream,
    so each sample gets the same noise every time; without it each epoch gets
    fresh, independent noise (and the accounting composes).
    """
    return base if reuse_noise else base + _STREAMS_PER_EPOCH * (epoch + 1)


class LabelParty:
    """P_L: labels, top model, optimizer, mechanism and noise key.

    Parameters
    ----------
    top
        The top model ``h`` mapping concatenated embeddings to logits (one
        logit for two classes, else ``k``).
    labels
        Training labels indexed by sample id (``labels[i]`` is sample ``i``'s),
        held as :func:`~tpsl_flwr._util.compact_ints.label_dtype`.
    mechanism
        The GradPerturb mechanism (its ``num_classes`` must fit ``labels``).
    key
        The secret noise key (never leaves this object but for checkpoints
        the label party writes for itself).
    placement
        ``"logits"`` (``epsilon``) or ``"cut"`` (``2 epsilon``).
    optimizer
        Factory building the top model's optimizer from its parameters.
    reuse_noise
        Draw each sample's noise once and reuse it in every epoch.
    noise_cache_bytes
        Each sample's noise is a keyed function of (key, sample id, stream), so
        the party derives a stream's noise for all training samples at once,
        the first time the stream is used, and indexes it per batch: the same
        values as drawing per batch, at almost no cost per step. Streams whose
        noise would take more than this many bytes are drawn per batch; 0
        turns the cache off. Only the streams of the current epoch are kept.
    denoise
        ``"none"``: train on (and send gradients of) the noisy labels, as the
        paper; ``"posterior"``: on their posterior given a prior (Malek et
        al.'s ALIBI; post-processing, same epsilon; noisy-label mechanisms
        only, :mod:`tpsl_flwr.privacy.posterior`).
    denoise_prior
        The posterior's prior: ``"model"``, the top model's current
        prediction for the batch (same forward pass, detached), or
        ``"frequency"``, class frequencies estimated once from all training
        samples' noisy labels.
    """

    def __init__(
        self,
        top: nn.Module,
        labels: np.ndarray,
        mechanism: Mechanism,
        key: NoiseKey,
        placement: str = "logits",
        optimizer: OptimizerFactory | None = None,
        reuse_noise: bool = True,
        noise_cache_bytes: int = NOISE_CACHE_BYTES,
        denoise: str = "none",
        denoise_prior: str = "model",
    ) -> None:
        self.top = top
        k = mechanism.num_classes
        self.labels = check_labels(labels, k, label_dtype(k))  # int8 below 128
        self.mechanism = mechanism
        self.key = key
        self.placement = check_placement(placement)
        self.reuse_noise = reuse_noise
        check_bound(  # a release's key at other settings: refused here
            key,
            None,
            mechanism=mechanism,
            placement=self.placement,
            reuse_noise=reuse_noise,
            user="LabelParty",
        )
        self.optimizer = (optimizer or adam(1e-3))(top.parameters())
        self.steps = 0
        self.noise_cache_bytes = int(noise_cache_bytes)
        self._noise_cache: dict[tuple[int, int | None], NoisyLabels] = {}
        for name, value, choices in (
            ("denoise", denoise, DENOISERS),
            ("denoise_prior", denoise_prior, DENOISE_PRIORS),
        ):
            if value not in choices:
                raise ConfigError(
                    f"{name} must be one of {', '.join(choices)}, got {value!r}"
                )
        if denoise == "posterior":
            check_denoisable(mechanism)
        self.denoise, self.denoise_prior = denoise, denoise_prior
        self._frequency_priors: dict[int, np.ndarray] = {}
        self._held_out = np.zeros(self.labels.size, dtype=bool)
        # Gradient-noise mechanisms: what the last batch left for the next.
        self._batch_reference: BatchReference | None = None
        # RR-with-prior: each stream's randomized labels, drawn at first use.
        self._drawn: dict[int, np.ndarray] = {}
        self._prior_models: dict[int, nn.Module] = {}
        self._resumed = False
        # Gradient-noise mechanisms: the key of their per-step normals (a
        # fresh one whenever the run continues an interrupted one).
        self._gradient_key = key

    @property
    def num_outputs(self) -> int:
        """Number of logits of the top model's head."""
        return 1 if self.mechanism.is_binary else self.mechanism.num_classes

    def _noisy(
        self, ids: np.ndarray, base: int, epoch: int, width: int | None = None
    ) -> NoisyLabels:
        stream = noise_stream(base, epoch, self.reuse_noise)
        cached = self._all_noise(stream, width)
        if cached is None:
            return draw_noisy_labels(
                self.mechanism,
                self.labels[ids],
                ids,
                self.key,
                stream,
                additive_dim=width,
            )
        additive = None if cached.additive is None else cached.additive[ids]
        return NoisyLabels(cached.coefficients[ids], additive)

    def _prior_noisy(
        self, ids: np.ndarray, base: int, epoch: int, emb: Tensor
    ) -> NoisyLabels:
        """RR-with-prior labels of the batch: drawn once per (stream, id), kept.

        Two stages per stream, as Ghazi et al.'s LP-2ST (Section 3.2): the
        first :data:`RR_PRIOR_FIRST_STAGE` of the trained ids to be drawn get
        a uniform prior (plain randomized response); then the top model is
        frozen as it is, and every later draw takes that frozen model's
        prediction for the sample as its prior. The frozen model has trained
        only on randomized labels of the first stage's samples, so a prior
        never depends on the label it randomizes (with fresh noise per epoch,
        but through that label's earlier releases, which the accounting
        composes); a model still training on its own predictions would
        reinforce them. A resumed run never draws: the interrupted run may
        already have sent a draw made with another prior (fail closed).
        """
        stream = noise_stream(base, epoch, self.reuse_noise)
        drawn = self._drawn.get(stream)
        if drawn is None:
            if not self.reuse_noise:  # a new epoch's streams replace the old
                epoch_of = (stream - 1) // _STREAMS_PER_EPOCH
                self._drawn = {
                    s: d
                    for s, d in self._drawn.items()
                    if (s - 1) // _STREAMS_PER_EPOCH == epoch_of
                }
                self._prior_models = {
                    s: m for s, m in self._prior_models.items() if s in self._drawn
                }
            k = self.mechanism.num_classes
            drawn = np.full(self.labels.size, -1, np.int8 if k < 128 else np.int32)
            self._drawn[stream] = drawn
        fresh = drawn[ids] < 0
        if not fresh.any():
            return NoisyLabels(
                one_hot(drawn[ids].astype(np.int64), self.mechanism.num_classes)
            )
        if self._resumed:
            raise PrivacyError(
                f"{self.mechanism.name}: a resumed run would randomize "
                f"{int(fresh.sum())} label(s) again with another prior than the "
                "interrupted run may have used; nothing is sent (start a new "
                "release)"
            )
        new = ids[fresh]
        frozen = self._prior_models.get(stream)
        if frozen is None:
            trained = int((~self._held_out).sum())
            if int((drawn >= 0).sum()) >= RR_PRIOR_FIRST_STAGE * trained:
                frozen = copy.deepcopy(self.top).eval()
                self._prior_models[stream] = frozen
        k = self.mechanism.num_classes
        if frozen is None:
            prior = np.full((new.size, k), 1.0 / k)
        else:
            with torch.no_grad():
                prior = model_prior(frozen(emb[torch.from_numpy(fresh)]))
        noisy = self.mechanism.sample_with_prior(
            self.labels[new].astype(np.int64), new, self.key, stream, prior
        )
        drawn[new] = np.argmax(noisy.coefficients, axis=1)
        return NoisyLabels(one_hot(drawn[ids].astype(np.int64), k))

    def _gradient_noise_step(self, ids: np.ndarray, emb: Tensor) -> Tensor:
        """Marvell / max-norm: exact top update, per-batch noise on ``g_y``.

        The top model trains on the exact labels and the dispatched gradient is
        the mechanism's noisy version of the clean per-sample cut-layer
        gradients (Li et al. 2022), scaled back to the mean loss.

        The normals of step ``s`` are keyed by (key, id, ``s``). A resumed run
        starts again from its checkpoint's step count, and the interrupted run
        may already have sent the steps after it: replayed under the same
        words with other clean gradients (the nodes choose the embeddings),
        the noise would cancel in the difference of the two transcripts. So a
        resumed run draws them under a fresh key (:meth:`mark_resumed`).
        """
        labels = self.labels[ids].astype(np.int64)
        clean = NoisyLabels(one_hot(labels, self.mechanism.num_classes))
        cut_grad, _ = logits_placement_backward(self.top, emb, clean)
        n = ids.size
        noisy, reference = perturb_gradients(
            self.mechanism,
            cut_grad.double().numpy() * n,
            labels,
            ids=ids,
            key=self._gradient_key,
            stream=gradient_noise_stream(self.steps),
            reference=self._batch_reference,
        )
        self._batch_reference = reference
        return torch.from_numpy(noisy / n)

    def _all_noise(self, stream: int, width: int | None) -> NoisyLabels | None:
        """Every training sample's noise on ``stream`` (None: over the cache cap)."""
        found = self._noise_cache.get((stream, width))
        if found is not None:
            return found
        n, k = self.labels.size, self.mechanism.num_classes
        columns = k
        if self.mechanism.additive:
            logits = 1 if self.mechanism.is_binary else k
            columns += logits if width is None else width
        if n * columns * 8 > self.noise_cache_bytes:
            return None
        if not self.reuse_noise:  # a new epoch's streams replace the old ones
            epoch_of = (stream - 1) // _STREAMS_PER_EPOCH
            self._noise_cache = {
                key: value
                for key, value in self._noise_cache.items()
                if (key[0] - 1) // _STREAMS_PER_EPOCH == epoch_of
            }
        found = draw_noisy_labels(
            self.mechanism,
            self.labels,
            np.arange(n, dtype=np.int64),
            self.key,
            stream,
            additive_dim=width,
        )
        self._noise_cache[(stream, width)] = found
        return found

    def _frequency_prior(self, stream: int) -> np.ndarray:
        """Class frequencies estimated from every training sample's noisy label."""
        found = self._frequency_priors.get(stream)
        if found is not None:
            return found
        trained = np.flatnonzero(~self._held_out)
        cached = self._all_noise(stream, None)
        if cached is not None:
            found = frequency_prior(
                mechanism=self.mechanism, coefficients=cached.coefficients[trained]
            )
        else:  # over the cache cap: draw in chunks, keep only the sum
            n, k = trained.size, self.mechanism.num_classes
            mean = np.zeros(k)
            for start in range(0, n, _PRIOR_CHUNK):
                ids = trained[start : start + _PRIOR_CHUNK]
                chunk = draw_noisy_labels(
                    self.mechanism, self.labels[ids], ids, self.key, stream
                )
                unbiased = unbiased_coefficients(
                    mechanism=self.mechanism, coefficients=chunk.coefficients
                )
                mean = mean + unbiased.sum(0) / n
            found = prior_from_mean(mean)
        self._frequency_priors = {stream: found}
        return found

    def _denoiser(self, epoch: int) -> Denoiser | None:
        """The posterior of the batch's noisy labels (None: train on them as is)."""
        if self.denoise == "none":
            return None
        fixed = None
        if self.denoise_prior == "frequency":
            stream = noise_stream(STREAM_TRANSCRIPT, epoch, self.reuse_noise)
            fixed = self._frequency_prior(stream)

        def posterior(logits: Tensor, noisy: NoisyLabels) -> NoisyLabels:
            prior = model_prior(logits) if fixed is None else fixed
            return NoisyLabels(
                posterior_coefficients(
                    mechanism=self.mechanism,
                    coefficients=noisy.coefficients,
                    prior=prior,
                )
            )

        return posterior

    def _unbiased(self, noisy: NoisyLabels) -> NoisyLabels:
        """The release's unbiased coefficients: what the dispatched gradient uses.

        With ``denoise = "posterior"`` only the top model trains on the
        posterior; the nodes get GradPerturb's gradient of an unbiased reading
        of the release itself (Laplace: clipped to ``[0, 1]`` and debiased,
        :mod:`~tpsl_flwr.privacy.clipped_release`; randomized response:
        debiased, an affine map), so no posterior and no prior enters what
        they receive. Sending the posterior's gradient instead mixed the top
        model's prediction into every dispatched gradient (200k synthetic
        rows, eps 1: SDA 0.768 against 0.721, norm 0.729 against 0.545);
        sending randomized response's biased ``e_y~`` while the top fits the
        posterior pulls the two apart (test AUC 0.59 against 0.74).
        """
        return NoisyLabels(
            unbiased_coefficients(
                mechanism=self.mechanism, coefficients=noisy.coefficients
            )
        )

    def hold_out(self, ids: np.ndarray) -> None:
        """Never train on ``ids``, nor estimate anything from their noisy labels.

        For validation (:mod:`~tpsl_flwr.validation.best_epoch`): a held-out
        label is released once, for the stopping decision. The frequency prior
        is then estimated from the trained ids only, so that with fresh noise
        per epoch (``reuse_noise=False``) no held-out label is released again
        through it.
        """
        held_out = np.zeros(self.labels.size, dtype=bool)
        held_out[np.asarray(ids, dtype=np.int64)] = True
        self._held_out = held_out
        self._frequency_priors = {}

    def check_ids(self, sample_ids: object) -> np.ndarray:
        """Validate training sample ids against the labels held (not held out)."""
        ids = check_sample_ids(sample_ids)
        if ids.max() >= self.labels.size:
            raise ConfigError(
                f"sample id {int(ids.max())} is outside the {self.labels.size} "
                "training labels held by the label party"
            )
        if self._held_out[ids].any():
            held = int(ids[self._held_out[ids]][0])
            raise PrivacyError(
                f"sample id {held} is held out for validation: it is never trained on"
            )
        return ids

    def train_step(
        self, sample_ids: object, embeddings: Tensor, epoch: int = 0
    ) -> Tensor:
        """One TPSL step: perturb, update the top model, return the gradient to send.

        Parameters
        ----------
        sample_ids
            ``(n,)`` training sample ids of the batch.
        embeddings
            ``(n, d)`` concatenated cut-layer embeddings of those samples.
        epoch
            The current epoch (selects the noise stream when noise is not reused).

        Returns
        -------
        torch.Tensor
            The perturbed cut-layer gradient ``(n, d)`` (float32).

        Raises
        ------
        PrivacyError
            If the embeddings, the posterior or the gradient are not finite,
            or the embeddings do not fit the batch; nothing is updated or
            returned then (fail closed).
        """
        ids = self.check_ids(sample_ids)
        emb = torch.as_tensor(embeddings, dtype=torch.float32)
        if emb.ndim != 2 or emb.shape[0] != ids.size:
            raise PrivacyError(
                f"embeddings of shape {tuple(emb.shape)} do not fit a batch of "
                f"{ids.size} sample ids"
            )
        if not all_finite(emb):
            raise PrivacyError("embeddings contain NaN or inf")
        self.optimizer.zero_grad()
        try:
            grad = self._perturbed_gradient(ids, emb, epoch)
        except BaseException:
            self.optimizer.zero_grad()
            raise
        if not all_finite(grad):
            self.optimizer.zero_grad()
            raise PrivacyError("the perturbed gradient is not finite; nothing sent")
        self.optimizer.step()
        self.steps += 1
        return grad.to(torch.float32)

    def _perturbed_gradient(self, ids: np.ndarray, emb: Tensor, epoch: int) -> Tensor:
        """The batch's gradient to dispatch; the top model's update accumulated."""
        if self.mechanism.gradient_noise:
            return self._gradient_noise_step(ids, emb)
        transcript_width = None
        if self.placement == "cut" and self.mechanism.additive:
            transcript_width = emb.shape[1]
        base = STREAM_CUT_GAUSSIAN if transcript_width else STREAM_TRANSCRIPT
        if self.mechanism.needs_prior:
            transcript = self._prior_noisy(ids, base, epoch, emb)
        else:
            transcript = self._noisy(ids, base, epoch, transcript_width)
        denoise = self._denoiser(epoch)
        dispatch = None if denoise is None else self._unbiased(transcript)
        if self.placement == "logits":
            grad, _ = logits_placement_backward(
                self.top, emb, transcript, denoise=denoise, dispatch=dispatch
            )
            return grad
        if self.mechanism.needs_prior:
            update = self._prior_noisy(ids, STREAM_TOP_UPDATE, epoch, emb)
        else:
            update = self._noisy(ids, STREAM_TOP_UPDATE, epoch)
        grad, _ = cut_placement_backward(
            self.top, emb, transcript, update, denoise=denoise, dispatch=dispatch
        )
        return grad

    def top_in_blocks(self, embeddings: Tensor | np.ndarray) -> Iterator[Tensor]:
        """The top model's logits, :data:`PREDICT_CHUNK_ROWS` rows at a time.

        No gradient is kept, so the activations held never grow with the rows
        (one block at least, for an empty input).
        """
        x = torch.as_tensor(embeddings, dtype=torch.float32)
        for start in range(0, max(1, x.shape[0]), PREDICT_CHUNK_ROWS):
            with torch.no_grad():
                logits = self.top(x[start : start + PREDICT_CHUNK_ROWS])
            yield logits

    @torch.no_grad()
    def predict(self, embeddings: Tensor) -> np.ndarray:
        """Class probabilities ``(n, k)`` for embeddings (evaluation only).

        The top model runs on at most :data:`PREDICT_CHUNK_ROWS` rows at a
        time, so its activations do not grow with the test set.
        """
        parts = []
        for logits in self.top_in_blocks(embeddings):
            if logits.shape[1] == 1:
                positive = torch.sigmoid(logits[:, 0])
                parts.append(torch.stack([1 - positive, positive], dim=1).numpy())
            else:
                parts.append(torch.softmax(logits, dim=1).numpy())
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume but the key, which is named by fingerprint.

        The key itself is kept apart, in the label party's key file
        (:class:`~tpsl_flwr.release.store.LabelStore`).
        """
        state: dict[str, Any] = {
            "top": self.top.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "steps": self.steps,
            "key_fingerprint": self.key.fingerprint,
        }
        if self._drawn:  # RR-with-prior: the labels already released
            state["drawn"] = {s: torch.from_numpy(d) for s, d in self._drawn.items()}
        if self._batch_reference is not None:
            state["batch_reference"] = {
                "values": torch.tensor(self._batch_reference.values),
                "direction": torch.from_numpy(self._batch_reference.direction),
            }
        return state

    def mark_resumed(self) -> None:
        """Mark the run as continuing a release an earlier run may have sent.

        RR-with-prior then never randomizes a label again (its draws depend on
        a prior the earlier run may have had otherwise), and Marvell and
        max-norm draw their per-step normals under a key of this run's own
        (derived from the key and 32 bytes from the OS, kept in memory only):
        the steps after the checkpoint were perhaps sent before, and a replay
        under the same words with other clean gradients cancels the noise.
        :meth:`load_state_dict` marks it too.
        """
        self._resumed = True
        self._gradient_key = self.key.derive(
            b"gradient noise of a resumed run\x00" + secrets.token_bytes(32)
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; it must have been saved under this key."""
        if state.get("key_fingerprint") != self.key.fingerprint:
            raise ConfigError(
                "the checkpoint was written with another noise key "
                f"(fingerprint {state.get('key_fingerprint')}, this run "
                f"{self.key.fingerprint})"
            )
        load_checkpoint_state(self.top, state["top"], "top model")
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state["steps"])
        self._drawn = {
            int(s): d.numpy().copy() for s, d in state.get("drawn", {}).items()
        }
        self.mark_resumed()
        reference = state.get("batch_reference")
        if reference is not None:
            self._batch_reference = BatchReference(
                tuple(float(x) for x in reference["values"].tolist()),
                reference["direction"].double().numpy().copy(),
            )
