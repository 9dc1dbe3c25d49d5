"""The paused-worker story end to end: the live lease server, and the SQL guard installed
by `fencelock guard install` into a fresh PostgreSQL database, called through
`fencelock.guard`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import psycopg
import pytest
from conftest import StartServer, install_guard

from fencelock import AsyncClient, Client, InvalidFenceToken, MalformedFenceToken, StaleFence
from fencelock.guard import admit, admit_async

UPSERT = """INSERT INTO reports VALUES (%s, %s, %s)
            ON CONFLICT (id) DO UPDATE SET body = excluded.body, fence = excluded.fence"""


def save(conn: psycopg.Connection[tuple[object, ...]], key: str, token: str, body: str) -> int:
    """A protected write: the guard's admission and the write in one transaction."""
    with conn.transaction():
        fence = admit(conn, key, token)
        conn.execute(UPSERT, (key, body, fence))
    return fence


def stored(conn: psycopg.Connection[tuple[object, ...]], key: str) -> tuple[object, ...] | None:
    return conn.execute("SELECT body, fence FROM reports WHERE id = %s", (key,)).fetchone()


def test_a_paused_worker_s_late_write_is_refused(start_server: StartServer, database: str) -> None:
    server = start_server()
    install_guard(database)
    with Client(server.url) as client, psycopg.connect(database, autocommit=True) as conn:
        a = client.acquire("report:7", 2)
        assert a is not None
        assert save(conn, "report:7", a.fence_token, "first draft by A") == a.fence
        # A pauses past its lease. B waits for the resource and gets it at A's expiry.
        b = client.acquire("report:7", 30, wait_ms=10_000)
        assert b is not None and b.fence > a.fence
        assert a.lost.is_set(), "A's lease was signalled lost before B had it"
        assert save(conn, "report:7", b.fence_token, "final by B") == b.fence
        # A wakes up and writes: the guard refuses, naming B's fence; nothing is written.
        with pytest.raises(StaleFence) as refused:
            save(conn, "report:7", a.fence_token, "late by A")
        assert refused.value.current == b.fence
        assert refused.value.key == "report:7"
        assert stored(conn, "report:7") == ("final by B", b.fence)
        # B writes again with the same fence: one holder writes many times.
        assert save(conn, "report:7", b.fence_token, "final by B, revised") == b.fence


def test_the_story_with_the_async_client(start_server: StartServer, database: str) -> None:
    server = start_server()
    install_guard(database)

    async def save_async(conn: psycopg.AsyncConnection[tuple[object, ...]], token: str, body: str) -> int:
        async with conn.transaction():
            fence = await admit_async(conn, "report:9", token)
            await conn.execute(UPSERT, ("report:9", body, fence))
        return fence

    async def main() -> None:
        async with AsyncClient(server.url) as client, await psycopg.AsyncConnection.connect(database, autocommit=True) as conn:
            a = await client.acquire("report:9", 2)
            assert a is not None
            async with client.lease("report:9", 30, wait_ms=10_000) as b:
                assert await save_async(conn, b.fence_token, "by B") == b.fence
                with pytest.raises(StaleFence) as refused:
                    await save_async(conn, a.fence_token, "late by A")
                assert refused.value.current == b.fence

    asyncio.run(main())


def test_signed_fences_are_checked_by_the_guard(start_server: StartServer, database: str, tmp_path: Path) -> None:
    key = tmp_path / "fence.key"
    key.write_bytes(bytes(range(32)))
    server = start_server("--fence-key", str(key))
    install_guard(database, key)
    with Client(server.url) as client, psycopg.connect(database, autocommit=True) as conn:
        with client.lease("report:1", 30) as lease, client.lease("report:2", 30) as other:
            assert save(conn, "report:1", lease.fence_token, "signed") == lease.fence
            for forged in (str(lease.fence), other.fence_token, f"{lease.fence}.{'A' * 43}"):
                with pytest.raises(InvalidFenceToken):
                    save(conn, "report:1", forged, "forged")
        assert stored(conn, "report:1") == ("signed", lease.fence)


def test_a_guard_without_keys_refuses_what_is_not_a_token(database: str) -> None:
    install_guard(database)
    with psycopg.connect(database, autocommit=True) as conn:
        for token in ("not-a-fence", "-3", ""):
            with pytest.raises(MalformedFenceToken):
                save(conn, "report:1", token, "never written")
        assert stored(conn, "report:1") is None
