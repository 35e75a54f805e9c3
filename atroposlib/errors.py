"""The exception tree shared by every part of atroposlib."""

from __future__ import annotations


class AtroposError(Exception):
    """Base class of every error this library raises on purpose."""


class ConfigError(AtroposError):
    """A setting has a value that cannot work; the message names the setting and the fix."""


class SandboxError(AtroposError):
    """The code sandbox itself could not run (not the program inside it failing)."""


class InvalidGroupError(AtroposError):
    """A scored group breaks the wire contract; ``field`` names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class BrokerError(AtroposError):
    """The broker answered with an error status or could not be reached."""


class BrokerUnavailableError(BrokerError):
    """The broker could not be reached, or kept answering 5xx/503 past the retry budget."""


class BrokerRejectedError(BrokerError):
    """The broker refused a request with a 4xx; retrying the same request cannot succeed."""

    def __init__(self, status_code: int, detail: object) -> None:
        super().__init__(f"broker answered {status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail


class UnknownEnvError(AtroposError):
    """A request names an env id that was never registered with ``POST /register-env``."""

    def __init__(self, env_id: int) -> None:
        super().__init__(
            f"env_id {env_id} is not registered; call POST /register-env first "
            "and use the env_id it returns"
        )
        self.env_id = env_id


class TrainerNotRegisteredError(AtroposError):
    """The trainer asked for a batch (or acked) before ``POST /register``."""


class RetryLaterError(AtroposError):
    """The broker cannot take the request now; nothing changed, retry after ``retry_after``
    seconds (HTTP 503 with ``Retry-After``)."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class QueueFullError(RetryLaterError):
    """The broker's queue is at its limit."""


class StoreWriteError(RetryLaterError):
    """The broker's store could not write (e.g. a full disk)."""


class RequestBodyError(AtroposError):
    """A request body cannot be read: too large (413), bad gzip or bad encoding (400)."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message


class InferenceError(AtroposError):
    """An inference server failed a request (connection, timeout, 5xx or an unreadable answer)."""


class InferenceUnavailableError(InferenceError):
    """Every attempt on every inference server failed; the rollout cannot be generated now."""


class InferenceEngineDeadError(InferenceError):
    """An inference server is up but its engine is dead: it says so (vLLM's ``EngineDeadError``)
    or answered HTTP 5xx to ``dead_after_5xx`` requests in a row. Retrying cannot help; the run
    stops with this one line (restart the server; its log has the cause)."""


class InferenceRejectedError(InferenceError):
    """The inference server refused the request (4xx): fix the request; retrying cannot help."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ContextFullError(AtroposError):
    """A trajectory leaves no room to sample under the env's ``max_token_length``."""


class ModelOutputError(AtroposError, ValueError):
    """Model-written JSON that cannot be used: malformed, nested too deep, too large, or holding
    text that is not UTF-8 (a lone surrogate). The caller treats the reply as malformed."""
