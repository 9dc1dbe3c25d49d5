"""The asyncio client: `AsyncClient`, and `AsyncLease`, renewed by a background task. The
same rules as `fencelock.client`, with `await` and an `asyncio.Event`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from types import TracebackType
from typing import Any, TypeVar

import httpx

from . import _protocol as wire
from ._base import Acquisition, ClientBase, Granted
from ._lease import RELEASED, UNCONFIRMED, LeaseBase, Renewals, log
from .errors import FencelockError, LeaseLost, NotAcquired, Unavailable

T = TypeVar("T")


class AsyncClient(
    ClientBase[
        httpx.AsyncClient,
        "Coroutine[Any, Any, AsyncLease | None]",
        "contextlib.AbstractAsyncContextManager[AsyncLease]",
    ]
):
    """`Client` for asyncio: the same arguments and rules, every call awaited. Close it with
    `await client.aclose()` (or use `async with`). `lease()` renews in a background task."""

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _connect(self, base_url: str, headers: dict[str, str], timeout: float) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout)

    async def _lease_or_none(self, call: Acquisition) -> AsyncLease | None:
        granted = await self._acquire(call)
        if isinstance(granted, NotAcquired):
            return None
        return AsyncLease(self, call.resource, call.ttl_seconds, granted, renewing=False)

    @contextlib.asynccontextmanager
    async def _renewed_lease(self, call: Acquisition) -> AsyncIterator[AsyncLease]:
        granted = await self._acquire(call)
        if isinstance(granted, NotAcquired):
            raise granted
        async with AsyncLease(self, call.resource, call.ttl_seconds, granted, renewing=True) as lease:
            yield lease

    async def _acquire(self, call: Acquisition) -> Granted | NotAcquired:
        async def attempt() -> Granted | NotAcquired:
            body, wait = call.request()
            return call.read(await self._send("POST", call.path, body, wait=wait))

        return await self._retrying(attempt, extra=call.extra)

    async def _retrying(
        self, attempt: Callable[[], Awaitable[T]], *, until: float | None = None, extra: float = 0.0
    ) -> T:
        """Runs `attempt`, retrying `Unavailable` under the policy (and never past `until`)."""
        retries = self._retry.start(until, extra)
        while True:
            try:
                return await attempt()
            except Unavailable as error:
                pause = retries.pause(error.retry_after)
                if pause is None:
                    raise
                await asyncio.sleep(pause)

    async def _send(
        self, method: str, path: str, body: dict[str, Any], *, wait: float = 0.0, timeout: float | None = None
    ) -> wire.Answer:
        try:
            response = await self._http.request(method, path, json=body, timeout=self._limits(wait, timeout))
        except httpx.HTTPError as error:
            raise wire.transport(error) from error
        return wire.Answer(response.status_code, response.content, response.headers)


class AsyncLease(LeaseBase):
    """`Lease` for asyncio: `lost` is an `asyncio.Event` (`await lease.lost.wait()`),
    `renew()` and `release()` are awaited, and `async with lease:` releases it."""

    lost: asyncio.Event

    def __init__(
        self, client: AsyncClient, resource: str, ttl_seconds: int, granted: Granted, *, renewing: bool
    ) -> None:
        super().__init__(resource, granted.owner, ttl_seconds, granted.grant, granted.sent)
        self.lost = asyncio.Event()
        self._client = client
        self._loop = asyncio.get_running_loop()
        self._deadline: asyncio.TimerHandle | None = None
        self._renewer: asyncio.Task[None] | None = None
        self._arm_deadline()
        if renewing:
            self._renewer = self._loop.create_task(self._keep_alive(), name=f"fencelock-renew {resource}")

    async def renew(self) -> None:
        """See `Lease.renew`."""
        self.check()
        until = self._term_now.safe_until
        await self._client._retrying(lambda: self._renew_once(until - time.monotonic()), until=until)

    async def release(self) -> None:
        """See `Lease.release`."""
        await self._stop_renewing()
        call = self._release_call()
        if call is None:
            return

        async def attempt() -> None:
            call.read(await self._client._send("DELETE", *call.request()))

        try:
            await self._client._retrying(attempt, until=self._term_now.safe_until)
        finally:
            self._lose(RELEASED)

    async def __aenter__(self) -> AsyncLease:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self.release()
        except LeaseLost:
            pass  # the block was told through `lost` and `check()`; leaving it is fine
        except FencelockError as failure:
            log.warning("lease on %s (fence %d) not released, it lapses by itself: %s", self.resource, self.fence, failure)

    async def _renew_once(self, timeout: float | None) -> None:
        sent = time.monotonic()
        if self._renewed(sent, await self._client._send("POST", *self._renew_request(), timeout=timeout)):
            self._arm_deadline()

    async def _keep_alive(self) -> None:
        """The renewal task (see `Lease._keep_alive`). Cancelled to stop; never raises."""
        try:
            renewals = Renewals(self)
            while True:
                await asyncio.sleep(renewals.pause())
                if self._lose_if_due():
                    return
                with renewals.attempt() as timeout:
                    await self._renew_once(timeout)
        except LeaseLost:
            return  # refused: the lease is marked lost already
        except Exception as bug:  # noqa: BLE001 - a task must not die unseen
            self._lose(UNCONFIRMED, f"the renewal task failed: {bug!r}")

    async def _stop_renewing(self) -> None:
        task, self._renewer = self._renewer, None
        if task is None or task is asyncio.current_task():
            return
        task.cancel()
        # `wait`, not `await task`: the task's cancellation is not ours to raise, while a
        # cancellation of the caller still goes through.
        await asyncio.wait([task])

    def _arm_deadline(self) -> None:
        """(Re)schedules the callback that sets `lost` at the safe deadline, independent of
        any request in flight."""
        delay = max(self._term_now.safe_until - time.monotonic(), 0)
        with self._guard:
            if self._loss is not None:
                return
            old, self._deadline = self._deadline, self._loop.call_later(delay, self._deadline_passed)
        if old is not None:
            old.cancel()

    def _deadline_passed(self) -> None:
        if not self._lose_if_due():
            self._arm_deadline()  # renewed meanwhile

    def _signal_lost(self) -> None:
        # `check()` may be called from a worker thread; the event belongs to the loop.
        if _running_loop() is self._loop:
            self._signal_lost_in_loop()
        else:
            self._loop.call_soon_threadsafe(self._signal_lost_in_loop)

    def _signal_lost_in_loop(self) -> None:
        with self._guard:
            handle, self._deadline = self._deadline, None
        if handle is not None:
            handle.cancel()
        if self._renewer is not None and self._renewer is not asyncio.current_task():
            self._renewer.cancel()
        self.lost.set()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
