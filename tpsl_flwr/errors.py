"""Project error types.

Every error raised for bad input or a protocol fault derives from
:class:`TPSLError`, a :class:`ValueError`, so callers can catch the project's
errors without swallowing programming errors.
"""

from __future__ import annotations


class TPSLError(ValueError):
    """Base class of every error tpsl-flwr raises on purpose."""


class ConfigError(TPSLError):
    """A configuration value is invalid (the message names the value)."""


class ProtocolError(TPSLError):
    """A message between the parties is missing, malformed or out of order."""


class PrivacyError(TPSLError):
    """Protection is configured but cannot be applied: fail closed."""


class ResumeRefused(ConfigError):
    """A resume refused before anything was sent or written.

    It would train at other settings than the checkpoints it continues (the
    message names them).

    Entry points leave the run's folder as they found it on this error
    (:func:`~tpsl_flwr.experiments.run_folder.run_in_folder`), as on
    :class:`ReleaseRefused`.
    """


class ReleaseRefused(PrivacyError):
    """The privacy ledger refused a release before anything was sent or written.

    Entry points leave the run's folder as they found it on this error
    (:func:`~tpsl_flwr.experiments.run_folder.run_in_folder`).
    """
