"""The HTTP contract in one place: the requests the clients send, and the one mapping of the
server's answers (status, problem type) to results and errors. Pure functions, shared by
`Client` and `AsyncClient`, so both read every answer alike.
"""

from __future__ import annotations

import email.utils
import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard
from urllib.parse import quote, urlsplit

from .errors import (
    FencelockError,
    Forbidden,
    LeaseLost,
    NotAcquired,
    ProtocolError,
    QuotaExceeded,
    Rejected,
    Unavailable,
)

# The characters the contract allows in a resource name besides letters and digits: they go
# into the path as they are, anything else percent-encoded (so the server sees the name as
# given, and answers 422 for a bad one, rather than another path).
_NAME_PUNCTUATION = "._-:@+=~"

# Longest slice of a body that is not JSON kept in an error (an HTML page from a proxy).
_MAX_RAW_BODY = 512


def base_url(url: str) -> str:
    """`url` checked (absolute `http`/`https`, no query or fragment) and without a trailing
    slash. A bad one is a `ValueError` at once, not an `Unavailable` at the first call."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"the lease server URL {url!r} is not an absolute http or https URL")
    if parts.query or parts.fragment:
        raise ValueError(f"the lease server URL {url!r} has a query or fragment")
    return url.rstrip("/")


def lock_path(resource: str, suffix: str = "") -> str:
    """`/locks/{resource}{suffix}`, the resource as one path segment."""
    if resource in (".", ".."):
        # Every URL parser folds these away as path steps, acting on another resource.
        raise ValueError(f"the resource {resource!r} cannot be named in a URL path")
    return f"/locks/{quote(resource, safe=_NAME_PUNCTUATION)}{suffix}"


def new_owner() -> str:
    """A fresh owner secret: 128 random bits, known only to this process."""
    return secrets.token_hex(16)


def acquire_body(owner: str, ttl_seconds: int, wait_ms: int, lock_delay_ms: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {"owner": owner, "ttl_seconds": ttl_seconds}
    # Absent rather than 0, so that servers without waiting or lock delay serve them too.
    if wait_ms:
        body["wait_ms"] = wait_ms
    if lock_delay_ms is not None:
        body["lock_delay_ms"] = lock_delay_ms
    return body


def renew_body(owner: str, ttl_seconds: int, fence: int) -> dict[str, Any]:
    return {"owner": owner, "ttl_seconds": ttl_seconds, "fence": fence}


def release_body(owner: str, fence: int) -> dict[str, Any]:
    return {"owner": owner, "fence": fence}


@dataclass(frozen=True)
class Grant:
    """A lease as acquire or renew confirmed it to its holder."""

    fence: int
    fence_token: str
    """The signed token when the server signs fences, else the fence as text."""
    expires_in_ms: int
    waited: float
    """How long the server waited before granting it (`waited_ms`), in seconds."""


@dataclass(frozen=True)
class Answer:
    """One HTTP answer, as read off the wire."""

    status: int
    body: bytes
    headers: Mapping[str, str]


def read_acquire(answer: Answer, resource: str) -> Grant | NotAcquired:
    """`200` with `acquired: true` is the lease; `acquired: false` is contention."""
    if answer.status != 200:
        raise failure(answer)
    body = _json_object(answer)
    if body.get("acquired") is False:
        delayed = body.get("delayed_until")
        return NotAcquired(resource, delayed if isinstance(delayed, str) else None)
    if body.get("acquired") is not True or not isinstance(body.get("lock"), dict):
        raise ProtocolError(f"acquire answered without a lock: {_excerpt(answer.body)}")
    lock = body["lock"]
    waited_ms = body.get("waited_ms", lock.get("waited_ms", 0))
    return _grant(lock, waited_ms)


def read_renew(answer: Answer, resource: str, fence: int) -> Grant:
    """`200` is the extended lease (with the fence sent); `404` and every `409`: lost."""
    if answer.status != 200:
        raise _loss(answer, resource) or failure(answer)
    lock = _json_object(answer).get("lock")
    if not isinstance(lock, dict):
        raise ProtocolError(f"renew answered without a lock: {_excerpt(answer.body)}")
    grant = _grant(lock, 0)
    if grant.fence != fence:
        raise ProtocolError(f"renew of fence {fence} answered with fence {grant.fence}")
    return grant


def read_release(answer: Answer, resource: str) -> None:
    """`204` is done; `404`, `403 forbidden` and `409`: the caller did not hold that lease
    (`403 forbidden-scope` is the bearer token's scope: `Forbidden`)."""
    if answer.status == 204:
        return
    if answer.status == 403 and _problem(answer).get("type") == "forbidden":
        raise LeaseLost(resource, "owner-mismatch", "another owner holds the lease")
    raise _loss(answer, resource) or failure(answer)


def _loss(answer: Answer, resource: str) -> LeaseLost | None:
    """The answers of renew and release that mean the lease is gone: `404`, any `409`."""
    if answer.status not in (404, 409):
        return None
    problem = _problem(answer)
    kind = problem.get("type")
    reason = kind if isinstance(kind, str) and kind else ("not-found" if answer.status == 404 else "conflict")
    detail = problem.get("detail")
    return LeaseLost(resource, reason, detail if isinstance(detail, str) else "")


def failure(answer: Answer) -> FencelockError:
    """Every answer an operation has no meaning of its own for. Outages (`5xx`, `408`, a
    `429` other than the token's quota) are `Unavailable`; a token refused is `Forbidden`,
    its quota `QuotaExceeded`; any other `4xx` is `Rejected`; the rest `ProtocolError`."""
    status = answer.status
    problem = _problem(answer)
    kind = problem.get("type")
    if status >= 500 or status == 408 or (status == 429 and kind != "quota-exceeded"):
        return Unavailable(f"{status} {kind or ''}: {problem.get('detail', '')}".strip(": "), retry_after(answer.headers))
    if status == 429:
        return QuotaExceeded(status, problem)
    if status == 401 or (status == 403 and kind == "forbidden-scope"):
        return Forbidden(status, problem)
    if 400 <= status < 500:
        return Rejected(status, problem)
    return ProtocolError(f"unexpected {status}: {_excerpt(answer.body)}")


def transport(error: Exception) -> Unavailable:
    """A failure to send or to read an answer: connection refused or reset, a timeout."""
    return Unavailable(f"the lease server could not be reached: {type(error).__name__}: {error}")


def retry_after(headers: Mapping[str, str]) -> float | None:
    """`Retry-After` in seconds (delay-seconds or an HTTP date), `None` without one."""
    value = headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def _grant(lock: dict[str, Any], waited_ms: Any) -> Grant:
    fence, expires_in_ms = lock.get("fence"), lock.get("expires_in_ms")
    if not _is_int(fence) or not _is_int(expires_in_ms):
        raise ProtocolError(f"a lock without an integer fence and expires_in_ms: {lock!r}")
    token = lock.get("fence_token")
    return Grant(
        fence=fence,
        fence_token=token if isinstance(token, str) else str(fence),
        expires_in_ms=expires_in_ms,
        waited=waited_ms / 1000 if _is_int(waited_ms) and waited_ms > 0 else 0.0,
    )


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _json_object(answer: Answer) -> dict[str, Any]:
    try:
        body = json.loads(answer.body)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise ProtocolError(f"expected a JSON object, got: {_excerpt(answer.body)}")
    return body


def _problem(answer: Answer) -> dict[str, Any]:
    """The problem document, or `{"detail": <the raw text>}` when the body is not one."""
    try:
        body = json.loads(answer.body)
    except ValueError:
        body = None
    return body if isinstance(body, dict) else {"detail": _excerpt(answer.body)}


def _excerpt(body: bytes) -> str:
    return body[:_MAX_RAW_BODY].decode("utf-8", "replace")
