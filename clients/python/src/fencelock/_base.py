"""What `Client` and `AsyncClient` share: their settings, and the steps of an acquire that
do not wait on I/O (each attempt's request, reading its answer). The two clients differ
only in how they wait.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import httpx

from . import _protocol as wire
from ._timing import RetryPolicy
from .errors import NotAcquired


class ClientBase:
    def __init__(self, url: str, *, token: str | None, timeout: float, retry: RetryPolicy | None) -> None:
        self._base_url = wire.base_url(url)
        self._headers = {"authorization": f"Bearer {token}"} if token is not None else {}
        self._timeout = timeout
        self._retry = retry or RetryPolicy()

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
        self.path = wire.lock_path(resource)
        self.owner = wire.new_owner()
        self.extra = wait_ms / 1000
        """How long the retries may go on beyond the policy's deadline: the wait."""
        self._ttl_seconds = ttl_seconds
        self._wait_ms = wait_ms
        self._lock_delay_ms = lock_delay_ms
        self._wait_until = time.monotonic() + wait_ms / 1000
        self._sent = 0.0

    def request(self) -> tuple[dict[str, Any], float]:
        """The body of the next attempt, sent now, and how long the server may wait (s)."""
        wait = max(round((self._wait_until - time.monotonic()) * 1000), 0) if self._wait_ms else 0
        self._sent = time.monotonic()
        return wire.acquire_body(self.owner, self._ttl_seconds, wait, self._lock_delay_ms), wait / 1000

    def read(self, answer: wire.Answer) -> Granted | NotAcquired:
        granted = wire.read_acquire(answer, self.resource)
        return granted if isinstance(granted, NotAcquired) else Granted(self.owner, granted, self._sent)
