"""What can go wrong, sorted by what the caller should do about it.

- `NotAcquired`: someone else holds the lock (for the whole wait). Try again later.
- `Unavailable`: the server could not be reached or could not answer, even after the bounded
  retries. The outcome is unknown.
- `LeaseLost`: the lease is no longer held (renewal refused, or its expiry came without a
  confirmed renewal). Stop the protected work.
- `StaleFence`, `InvalidFenceToken`, `MalformedFenceToken`: the SQL guard refused a write
  (and `FencingTokenRequired`: a write came without its token, see `fencelock.starlette`).
- `Rejected` (with `Forbidden` and `QuotaExceeded`): the server refused the request as it
  stands; sending it again will not help.
- `ProtocolError`: an answer outside the HTTP contract (not a fencelock server?).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "FencelockError",
    "NotAcquired",
    "LeaseLost",
    "Unavailable",
    "StaleFence",
    "InvalidFenceToken",
    "MalformedFenceToken",
    "FencingTokenRequired",
    "Rejected",
    "Forbidden",
    "QuotaExceeded",
    "ProtocolError",
]


class FencelockError(Exception):
    """The base of every error this package raises."""


class NotAcquired(FencelockError):
    """Another owner holds `resource` (through the whole `wait_ms`, when one was given).

    `delayed_until` is set (RFC 3339) when the resource is free but in its lock delay.
    """

    def __init__(self, resource: str, delayed_until: str | None = None) -> None:
        detail = f" (lock delay until {delayed_until})" if delayed_until else ""
        super().__init__(f"{resource!r} is held by another owner{detail}")
        self.resource = resource
        self.delayed_until = delayed_until


class LeaseLost(FencelockError):
    """The lease on `resource` is no longer held: stop the work it protects.

    `reason` is the server's problem type when it refused (`"not-found"`, `"lease-expired"`,
    `"owner-mismatch"`, `"stale-fence"`, ...), `"unconfirmed"` when no renewal was confirmed
    before the lease's safe deadline, or `"released"` after its holder released it.
    """

    def __init__(self, resource: str, reason: str, detail: str = "") -> None:
        super().__init__(f"the lease on {resource!r} is lost: {reason}{': ' + detail if detail else ''}")
        self.resource = resource
        self.reason = reason


class Unavailable(FencelockError):
    """The server was unreachable, timed out, or answered `5xx`, `408` or `429` after the
    bounded retries. An acquire that ends like this may have succeeded unseen; its lease then
    lapses at the end of its TTL (nobody else knows its owner secret).

    `retry_after` is the server's `Retry-After`, in seconds, when it sent one.
    """

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class StaleFence(FencelockError):
    """The guard refused a write whose fence is lower than one it has admitted for `key`:
    a newer lease exists. `current` is that newer fence (when the guard named it)."""

    def __init__(self, key: str, current: int | None, message: str = "") -> None:
        super().__init__(message or f"stale fence for {key!r}; the current fence is {current}")
        self.key = key
        self.current = current


class InvalidFenceToken(FencelockError):
    """The guard refused a token not signed by one of its keys for this key (a forged
    token, a token of another resource, or a bare fence where signed ones are required)."""


class MalformedFenceToken(FencelockError):
    """The guard was given something that is not a fence token at all."""


class FencingTokenRequired(FencelockError):
    """A write to a protected service came without the `Fencing-Token` header."""


class Rejected(FencelockError):
    """The server refused the request as it stands (a `4xx`): a bug in the request or the
    set-up, not a passing condition. `problem` is the server's RFC 9457 document."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        kind = problem.get("type", "")
        detail = problem.get("detail", "")
        super().__init__(f"{status} {kind}: {detail}".rstrip(": "))
        self.status = status
        self.problem = problem
        self.problem_type: str = kind if isinstance(kind, str) else ""


class Forbidden(Rejected):
    """The bearer token is missing or unknown (`401 unauthorized`), or does not cover this
    resource or operation (`403 forbidden-scope`)."""


class QuotaExceeded(Rejected):
    """The bearer token holds its `max_leases` already (`429 quota-exceeded`): release one
    first; waiting alone does not help."""


class ProtocolError(FencelockError):
    """An answer that breaks the HTTP contract."""
