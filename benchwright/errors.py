"""Expected, user-facing failures of the Benchwright domain.

Domain code raises these; the API maps them to HTTP in one place (``api/errors.py``) and activities
translate them to non-retryable Temporal ``ApplicationError``s.

    BenchwrightError
    ├── InvalidInput        400 — a value is present but not acceptable (bad enum, unenforceable limit)
    │   └── DatasetError    400 — a dataset cannot be read or understood
    ├── Unauthorized        401 — missing or wrong API key
    ├── PaymentRequired     402 — the account's balance is exhausted
    ├── NotFound            404 — no such resource for this caller
    ├── Conflict            409 — the resource is in a state that refuses the call
    ├── PayloadTooLarge     413 — the request (or what it would make: a workflow input) is over a size limit
    ├── QuotaExceeded       429 — the account is at a quota (``benchwright.security.quotas``); carries Retry-After
    └── Unavailable         503 — a service Benchwright needs is not answering
"""

from __future__ import annotations


class BenchwrightError(Exception):
    """Base for expected, user-facing failures. ``code`` is the machine-readable error code."""

    code = "error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class InvalidInput(BenchwrightError):
    code = "invalid_input"


class DatasetError(InvalidInput):
    code = "dataset_error"


class Unauthorized(BenchwrightError):
    code = "unauthorized"


class PaymentRequired(BenchwrightError):
    code = "balance_exhausted"


class NotFound(BenchwrightError):
    code = "not_found"


class Conflict(BenchwrightError):
    code = "conflict"


class PayloadTooLarge(BenchwrightError):
    code = "payload_too_large"


class QuotaExceeded(BenchwrightError):
    """The account is at one of its quotas: which, the use and the limit are in the message; come back later."""

    code = "quota_exceeded"

    def __init__(self, message: str, *, retry_after_s: int, quota: str, used: int, limit: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.quota = quota
        self.used = used
        self.limit = limit


class Unavailable(BenchwrightError):
    code = "unavailable"
