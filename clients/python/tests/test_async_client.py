"""`AsyncClient` and `AsyncLease` against the live lease server: the same rules as the
blocking client, awaited."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Awaitable, Callable

import pytest
from conftest import LeaseServer

from fencelock import AsyncClient, LeaseLost, NotAcquired, RetryPolicy, Unavailable


def run(server: LeaseServer, main: Callable[[AsyncClient], Awaitable[None]]) -> None:
    """Runs `main` in an event loop of its own with a client of `server`, closed at its end."""

    async def with_client() -> None:
        async with AsyncClient(server.url) as client:
            await main(client)

    asyncio.run(with_client())


def test_acquire_renew_release(server: LeaseServer) -> None:
    async def main(client: AsyncClient) -> None:
        lease = await client.acquire("job:1", 30)
        assert lease is not None and lease.fence_token == str(lease.fence)
        assert await client.acquire("job:1", 30) is None
        await lease.renew()
        assert lease.remaining > 25
        await lease.release()
        assert server.inspect("job:1") is None
        assert lease.lost.is_set()
        with pytest.raises(NotAcquired):
            async with client.lease("job:2", 30), client.lease("job:2", 30, wait_ms=200):
                pass

    run(server, main)


def test_a_block_renews_past_the_ttl_and_releases_at_its_end(server: LeaseServer) -> None:
    async def main(client: AsyncClient) -> None:
        async with client.lease("job:long", 2) as lease:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(lease.lost.wait(), 4.5)  # 4.5 s of work
            lease.check()
            live = server.inspect("job:long")
            assert live is not None and live["fence"] == lease.fence
        assert server.inspect("job:long") is None

    run(server, main)


def test_the_lost_signal_fires_within_the_ttl_when_the_server_dies(server: LeaseServer) -> None:
    async def main(client: AsyncClient) -> None:
        async with client.lease("job:doomed", 2) as lease:
            await asyncio.sleep(0.8)  # a first renewal goes through
            assert not lease.lost.is_set()
            server.kill()
            # Within the 2 s TTL (the safe deadline is at most 1.8 s after the kill).
            await asyncio.wait_for(lease.lost.wait(), 2.0)
            with pytest.raises(LeaseLost) as lost:
                lease.check()
            assert lost.value.reason == "unconfirmed"
        # Leaving the block raised nothing.

    run(server, main)


def test_a_lease_not_renewed_is_lost_before_another_owner_can_have_it(server: LeaseServer) -> None:
    async def main(client: AsyncClient) -> None:
        lease = await client.acquire("job:taken", 2)
        assert lease is not None
        assert await client.acquire("job:taken", 30, wait_ms=10_000) is not None
        assert lease.lost.is_set(), "the holder was told before the hand-over"

    run(server, main)


def test_check_from_a_worker_thread_sets_the_event_in_the_loop(server: LeaseServer) -> None:
    async def main(client: AsyncClient) -> None:
        lease = await client.acquire("job:thread", 1)
        assert lease is not None
        await lease.release()
        errors: list[BaseException] = []

        def work() -> None:
            try:
                lease.check()
            except LeaseLost as error:
                errors.append(error)

        thread = threading.Thread(target=work)
        thread.start()
        await asyncio.to_thread(thread.join)
        assert [type(e) for e in errors] == [LeaseLost]

    run(server, main)


def test_a_dead_server_is_unavailable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def main() -> None:
        async with AsyncClient(f"http://127.0.0.1:{port}", retry=RetryPolicy(deadline=1.0)) as client:
            started = time.monotonic()
            with pytest.raises(Unavailable):
                await client.acquire("job:1", 30)
            assert time.monotonic() - started < 2.0

    asyncio.run(main())
