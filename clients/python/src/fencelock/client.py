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
from ._lease import RELEASED, UNCONFIRMED, LeaseBase, Renewals, log
from .errors import FencelockError, LeaseLost, NotAcquired, Unavailable

T = TypeVar("T")


class Client(ClientBase[httpx.Client, "Lease | None", "contextlib.AbstractContextManager[Lease]"]):
    """A client of one fencelock server (or of a load balancer before several sharing a
    store). Thread-safe; close it (or use `with`) to free its connections. `lease()` renews
    on a background thread."""

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connect(self, base_url: str, headers: dict[str, str], timeout: float) -> httpx.Client:
        return httpx.Client(base_url=base_url, headers=headers, timeout=timeout)

    def _lease_or_none(self, call: Acquisition) -> Lease | None:
        granted = self._acquire(call)
        if isinstance(granted, NotAcquired):
            return None
        return Lease(self, call.resource, call.ttl_seconds, granted, renewing=False)

    @contextlib.contextmanager
    def _renewed_lease(self, call: Acquisition) -> Iterator[Lease]:
        granted = self._acquire(call)
        if isinstance(granted, NotAcquired):
            raise granted
        with Lease(self, call.resource, call.ttl_seconds, granted, renewing=True) as lease:
            yield lease

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
        """The renewal thread, on the schedule of `Renewals`. Never raises: every end is a
        loss or a stop."""
        try:
            renewals = Renewals(self)
            while not (self._stop.wait(renewals.pause()) or self._lose_if_due()):
                with renewals.attempt() as timeout:
                    self._renew_once(timeout)
        except LeaseLost:
            return  # refused: the lease is marked lost already
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
