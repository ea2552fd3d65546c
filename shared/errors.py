"""One root error type with a subclass per boundary.

Each error carries a stable `code`, the HTTP status it maps to (the FastAPI apps map
them in one handler) and a `hint` that tells the user what to do next.
"""

from __future__ import annotations


class EdgefleetError(Exception):
    code = "internal"
    http_status = 500
    hint = ""

    def __init__(self, message: str, *, hint: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        if hint is not None:
            self.hint = hint
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.message} (hint: {self.hint})" if self.hint else self.message


class ConfigError(EdgefleetError):
    code = "config_invalid"
    http_status = 400
    hint = "fix the setting named in the message; `--help` lists every setting"


class InvalidInput(EdgefleetError):
    code = "invalid_input"
    http_status = 422


class ImageRejected(InvalidInput):
    """An image that cannot be decoded safely."""

    code = "image_invalid"
    http_status = 400


class UnsupportedMediaType(ImageRejected):
    code = "unsupported_media_type"
    http_status = 415
    hint = "send JPEG, PNG, BMP, WebP or TIFF"


class PayloadTooLarge(ImageRejected):
    code = "payload_too_large"
    http_status = 413
    hint = "send a smaller image or raise the limit in the settings"


class AuthError(EdgefleetError):
    code = "unauthorized"
    http_status = 401
    hint = "send `Authorization: Bearer <token>` with a device token or operator API key"


class Forbidden(EdgefleetError):
    code = "forbidden"
    http_status = 403


class NotFound(EdgefleetError):
    code = "not_found"
    http_status = 404


class Conflict(EdgefleetError):
    code = "conflict"
    http_status = 409


class Overloaded(EdgefleetError):
    """Retryable refusal: a bounded queue is full or the memory watermark is reached."""

    code = "overloaded"
    http_status = 429
    hint = "retry after the number of seconds in Retry-After"

    def __init__(self, message: str, *, retry_after_s: float = 1.0, **kwargs):
        super().__init__(message, **kwargs)
        self.retry_after_s = retry_after_s


class MemoryBudgetExceeded(Overloaded):
    code = "memory_budget_exceeded"
    http_status = 503
    hint = "load fewer models, lower max batch, or raise the memory budget"


class InferenceTimeout(EdgefleetError):
    code = "inference_timeout"
    http_status = 504


class ModelNotFound(NotFound):
    code = "model_not_found"


class ModelIntegrityError(EdgefleetError):
    code = "model_integrity"
    http_status = 422
    hint = "the file does not match the sha256 in the trusted manifest; fetch it again"


class SourceDisconnected(EdgefleetError):
    code = "source_disconnected"
    http_status = 503


class PayloadRejected(EdgefleetError):
    """A message that failed verification; `reason` is the metrics label."""

    code = "payload_rejected"
    http_status = 400

    def __init__(self, reason: str, message: str, **kwargs):
        super().__init__(message, code=f"rejected_{reason}", **kwargs)
        self.reason = reason


class DeviceTaken(EdgefleetError):
    """A second agent for a device id that another agent already runs."""

    code = "device_taken"
    http_status = 409
    hint = "one device id runs one agent: stop the other agent, or enroll a new device id"
