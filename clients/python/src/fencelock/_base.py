"""What `Client` and `AsyncClient` share: their settings, their calls' arguments, and the
steps of an acquire that do not wait on I/O (each attempt's request, reading its answer).
The two clients differ only in how they wait.
"""

from __future__ import annotations

import time
from typing import Any, Generic, NamedTuple, TypeVar

import httpx

from . import _protocol as wire
from ._timing import RetryPolicy
from .errors import NotAcquired

H = TypeVar("H", httpx.Client, httpx.AsyncClient)
"""The HTTP client underneath."""
A = TypeVar("A")
"""What `acquire` gives: the lease or `None`, or (asyncio) an awaitable of it."""
L = TypeVar("L")
"""What `lease` gives: a context manager of the lease, or (asyncio) an async one."""


class ClientBase(Generic[H, A, L]):
    """A client of one fencelock server (or of a load balancer before several sharing a
    store): what `Client` and `AsyncClient` are alike in."""

    _http: H

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float = 10.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        """`token` is the bearer secret for a server with `--auth-file`; `timeout` bounds each
        request (plus the wait of an acquire with `wait_ms`); `retry` bounds how long an
        outage is retried (by default: pauses from 100 ms doubling to 1 s, for at most 5 s)."""
        headers = {"authorization": f"Bearer {token}"} if token is not None else {}
        self._http = self._connect(wire.base_url(url), headers, timeout)
        self._timeout = timeout
        self._retry = retry or RetryPolicy()

    def acquire(
        self,
        resource: str,
        ttl_seconds: int,
        *,
        wait_ms: int = 0,
        lock_delay_ms: int | None = None,
    ) -> A:
        """Acquires `resource` for `ttl_seconds` under a fresh owner secret: the lease, or
        `None` when another owner holds it (through `wait_ms`, when given: the server
        waits, first come first served). The lease is *not* renewed by itself: call
        `renew()` in time, or use `lease()`. Outages are retried under the client's policy
        with the same owner (a re-acquire), then raise `Unavailable`."""
        return self._lease_or_none(Acquisition(resource, ttl_seconds, wait_ms, lock_delay_ms))

    def lease(
        self,
        resource: str,
        ttl_seconds: int,
        *,
        wait_ms: int = 0,
        lock_delay_ms: int | None = None,
    ) -> L:
        """`with client.lease("job:42", 30) as lease:` (`async with` on an `AsyncClient`)
        acquires (raising `NotAcquired` when held), renews every third of the TTL in the
        background (a thread, or a task) while the block runs, and releases at its end. A
        loss sets `lease.lost` and makes `lease.check()` raise; it never raises on its own,
        and leaving the block after it raises nothing."""
        return self._renewed_lease(Acquisition(resource, ttl_seconds, wait_ms, lock_delay_ms))

    def _connect(self, base_url: str, headers: dict[str, str], timeout: float) -> H:
        raise NotImplementedError

    def _lease_or_none(self, call: Acquisition) -> A:
        """`acquire` once its arguments are checked."""
        raise NotImplementedError

    def _renewed_lease(self, call: Acquisition) -> L:
        """`lease` once its arguments are checked."""
        raise NotImplementedError

    def _limits(self, wait: float, timeout: float | None) -> httpx.Timeout:
        """The client's timeout (or a tighter one), with the server's `wait` on top for the
        answer to arrive."""
        limit = self._timeout if timeout is None else min(timeout, self._timeout)
        return httpx.Timeout(limit, read=limit + wait)


class Granted(NamedTuple):
    """A successful acquire: the owner secret, the lease, and when its request was sent."""

    owner: str
    grant: wire.Grant
    sent: float


class Acquisition:
    """One acquire call. It keeps one owner secret through all its attempts, so that a
    retry after an outage re-acquires what an unseen success took; each attempt asks the
    server to wait only for what is left of `wait_ms`."""

    def __init__(self, resource: str, ttl_seconds: int, wait_ms: int, lock_delay_ms: int | None) -> None:
        self.resource = resource
        self.ttl_seconds = ttl_seconds
        self.path = wire.lock_path(resource)
        self.owner = wire.new_owner()
        self.extra = wait_ms / 1000
        """How long the retries may go on beyond the policy's deadline: the wait."""
        self._wait_ms = wait_ms
        self._lock_delay_ms = lock_delay_ms
        self._wait_until: float | None = None
        """When the wait ends: `wait_ms` after the first attempt."""
        self._sent = 0.0

    def request(self) -> tuple[dict[str, Any], float]:
        """The body of the next attempt, sent now, and how long the server may wait (s)."""
        if self._wait_until is None:
            self._wait_until = time.monotonic() + self._wait_ms / 1000
        wait = max(round((self._wait_until - time.monotonic()) * 1000), 0) if self._wait_ms else 0
        self._sent = time.monotonic()
        return wire.acquire_body(self.owner, self.ttl_seconds, wait, self._lock_delay_ms), wait / 1000

    def read(self, answer: wire.Answer) -> Granted | NotAcquired:
        granted = wire.read_acquire(answer, self.resource)
        return granted if isinstance(granted, NotAcquired) else Granted(self.owner, granted, self._sent)
