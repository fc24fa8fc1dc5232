"""The mechanism math: what GradPerturb draws, how it is applied, what it costs.

numpy (and torch where gradients are applied) only; no Flower.

* :mod:`~tpsl_flwr.privacy.mechanisms`: the mechanisms as small frozen
  descriptions and the registry that names, for each, its parameter, sampler,
  accounting event and closed forms.
* :mod:`~tpsl_flwr.privacy.keyed_noise`: per-sample randomness as an AES PRF of
  (secret key, sample id, stream), so noise is reused without storage.
* :mod:`~tpsl_flwr.privacy.exact_laplace` and
  :mod:`~tpsl_flwr.privacy.noisy_labels`: the exact samplers.
* :mod:`~tpsl_flwr.privacy.perturb`: GradPerturb as one backward pass of a
  coefficient-weighted loss.
* :mod:`~tpsl_flwr.privacy.posterior`: noise-aware training, the posterior of
  the true label given its noisy release (post-processing).
* :mod:`~tpsl_flwr.privacy.accounting`, :mod:`~tpsl_flwr.privacy.closed_forms`,
  :mod:`~tpsl_flwr.privacy.empirical`: the budget, the attack ceilings and
  closed forms, and empirical lower bounds on epsilon.
"""
