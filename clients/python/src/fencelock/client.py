"""The blocking client: `Client`, and `Lease`, renewed on a background thread."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, TypeVar

import httpx

from . import _protocol as wire
from ._base import Acquisition, ClientBase, Granted
from ._lease import RELEASED, UNCONFIRMED, LeaseBase, log
from ._timing import RetryPolicy
from .errors import FencelockError, LeaseLost, NotAcquired, Unavailable

T = TypeVar("T")


class Client(ClientBase):
    """A client of one fencelock server (or of a load balancer before several sharing a
    store). Thread-safe; close it (or use `with`) to free its connections.

    `token` is the bearer secret for a server with `--auth-file`; `timeout` bounds each
    request (plus the wait of an acquire with `wait_ms`); `retry` bounds how long an outage
    is retried (by default: pauses from 100 ms doubling to 1 s, for at most 5 s).
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float = 10.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        super().__init__(url, token=token, timeout=timeout, retry=retry)
        self._http = httpx.Client(base_url=self._base_url, headers=self._headers, timeout=timeout)

    def acquire(
        self,
        resource: str,
        ttl_seconds: int,
        *,
        wait_ms: int = 0,
        lock_delay_ms: int | None = None,
    ) -> Lease | None:
        """Acquires `resource` for `ttl_seconds` under a fresh owner secret: the `Lease`, or
        `None` when another owner holds it (through `wait_ms`, when given: the server
        waits, first come first served). The lease is *not* renewed by itself: call
        `renew()` in time, or use `lease()`. Outages are retried under the client's policy
        with the same owner (a re-acquire), then raise `Unavailable`."""
        granted = self._acquire(Acquisition(resource, ttl_seconds, wait_ms, lock_delay_ms))
        if isinstance(granted, NotAcquired):
            return None
        return Lease(self, resource, ttl_seconds, granted, renewing=False)

    @contextlib.contextmanager
    def lease(
        self,
        resource: str,
        ttl_seconds: int,
        *,
        wait_ms: int = 0,
        lock_delay_ms: int | None = None,
    ) -> Iterator[Lease]:
        """`with client.lease("job:42", 30) as lease:` acquires (raising `NotAcquired` when
        held), renews every third of the TTL on a background thread while the block runs,
        and releases at its end. A loss sets `lease.lost` and makes `lease.check()` raise;
        it never raises on its own, and leaving the block after it raises nothing."""
        granted = self._acquire(Acquisition(resource, ttl_seconds, wait_ms, lock_delay_ms))
        if isinstance(granted, NotAcquired):
            raise granted
        with Lease(self, resource, ttl_seconds, granted, renewing=True) as lease:
            yield lease

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _acquire(self, call: Acquisition) -> Granted | NotAcquired:
        def attempt() -> Granted | NotAcquired:
            body, wait = call.request()
            return call.read(self._send("POST", call.path, body, wait=wait))

        return self._retrying(attempt, extra=call.extra)

    def _retrying(self, attempt: Callable[[], T], *, until: float | None = None, extra: float = 0.0) -> T:
        """Runs `attempt`, retrying `Unavailable` under the policy (and never past `until`)."""
        retries = self._retry.start(until, extra)
        while True:
            try:
                return attempt()
            except Unavailable as error:
                pause = retries.pause(error.retry_after)
                if pause is None:
                    raise
                time.sleep(pause)

    def _send(
        self, method: str, path: str, body: dict[str, Any], *, wait: float = 0.0, timeout: float | None = None
    ) -> wire.Answer:
        try:
            response = self._http.request(method, path, json=body, timeout=self._limits(wait, timeout))
        except httpx.HTTPError as error:
            raise wire.transport(error) from error
        return wire.Answer(response.status_code, response.content, response.headers)


class Lease(LeaseBase):
    """A held lock on one resource.

    - `fence_token` is what to send as `Fencing-Token` with every protected write.
    - `lost` (a `threading.Event`) is set as soon as the lease can no longer be trusted: a
      renewal was refused, or its safe deadline (the expiry of the last confirmed grant,
      counted from when that request was sent, less a tenth of the TTL, at most 1 s) came
      without a confirmed renewal; also once it is released. `check()` raises `LeaseLost`.
    - `renew()` and `release()` act at once; a lease from `Client.lease()` renews itself.
    - `with lease:` releases it at the end of the block, never raising for a loss.
    """

    lost: threading.Event

    def __init__(self, client: Client, resource: str, ttl_seconds: int, granted: Granted, *, renewing: bool) -> None:
        super().__init__(resource, granted.owner, ttl_seconds, granted.grant, granted.sent)
        self.lost = threading.Event()
        self._client = client
        self._deadline: threading.Timer | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._arm_deadline()
        if renewing:
            self._renewer = threading.Thread(target=self._keep_alive, name=f"fencelock-renew {resource}", daemon=True)
            self._renewer.start()

    def renew(self) -> None:
        """Extends the lease by its TTL from now, retrying an outage until its safe deadline.
        `LeaseLost` if the server refused (the lease is then lost), `Unavailable` if it could
        not be asked in time."""
        self.check()
        until = self._term_now.safe_until
        self._client._retrying(lambda: self._renew_once(until - time.monotonic()), until=until)

    def release(self) -> None:
        """Stops the renewals and gives the lease back, naming its fence (so it can never
        free a newer lease); outages are retried until its safe deadline. Releasing twice
        is a no-op. `LeaseLost` if it was lost already; `Unavailable` if the server could
        not be asked (the lease then lapses at the end of its TTL)."""
        self._stop_renewing()
        call = self._release_call()
        if call is None:
            return
        try:
            self._client._retrying(
                lambda: call.read(self._client._send("DELETE", *call.request())), until=self._term_now.safe_until
            )
        finally:
            self._lose(RELEASED)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        try:
            self.release()
        except LeaseLost:
            pass  # the block was told through `lost` and `check()`; leaving it is fine
        except FencelockError as failure:
            log.warning("lease on %s (fence %d) not released, it lapses by itself: %s", self.resource, self.fence, failure)

    def _renew_once(self, timeout: float | None) -> None:
        sent = time.monotonic()
        if self._renewed(sent, self._client._send("POST", *self._renew_request(), timeout=timeout)):
            self._arm_deadline()

    def _keep_alive(self) -> None:
        """The renewal thread: renews every third of the granted time; retries failures with
        backoff until the safe deadline. Never raises: every end is a loss or a stop."""
        try:
            failures = 0
            wake = self._term_now.renew_at
            while True:
                term = self._term_now
                if self._stop.wait(max(min(wake, term.safe_until) - time.monotonic(), 0)) or self._lose_if_due():
                    return
                try:
                    self._renew_once(term.attempt_timeout(time.monotonic()))
                except LeaseLost:
                    return
                except FencelockError as error:
                    failures += 1
                    wake = self._renewal_failed(term, failures, error)
                else:
                    failures = 0
                    wake = self._term_now.renew_at
        except BaseException as bug:  # noqa: BLE001 - a thread must not die unseen
            self._lose(UNCONFIRMED, f"the renewal thread failed: {bug!r}")

    def _stop_renewing(self) -> None:
        self._stop.set()
        if self._renewer is not None and self._renewer is not threading.current_thread():
            self._renewer.join()

    def _arm_deadline(self) -> None:
        """(Re)starts the timer that sets `lost` at the safe deadline, independent of any
        request in flight."""
        timer = threading.Timer(max(self._term_now.safe_until - time.monotonic(), 0), self._deadline_passed)
        timer.daemon = True
        with self._guard:
            if self._loss is not None:
                return
            old, self._deadline = self._deadline, timer
        if old is not None:
            old.cancel()
        timer.start()

    def _deadline_passed(self) -> None:
        if not self._lose_if_due():
            self._arm_deadline()  # renewed meanwhile

    def _signal_lost(self) -> None:
        self._stop.set()
        with self._guard:
            timer, self._deadline = self._deadline, None
        if timer is not None:
            timer.cancel()
        self.lost.set()
