"""`Client` and `Lease` against the live lease server."""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from conftest import LeaseServer, StartServer, expire_in_store, set_connections

from fencelock import (
    Client,
    Forbidden,
    LeaseLost,
    NotAcquired,
    QuotaExceeded,
    Rejected,
    RetryPolicy,
    Unavailable,
)


def test_acquire_gives_a_fence_and_a_held_resource_gives_none(server: LeaseServer) -> None:
    with Client(server.url) as client:
        first = client.acquire("job:1", 30)
        assert first is not None
        assert first.resource == "job:1"
        assert first.fence >= 1
        assert first.fence_token == str(first.fence)
        assert client.acquire("job:1", 30) is None, "held by another owner: None, at once"
        other = client.acquire("job:2", 30)
        assert other is not None and other.fence > first.fence
        live = server.inspect("job:1")
        assert live is not None and live["fence"] == first.fence and "owner" not in live
        assert not first.lost.is_set()
        first.check()


def test_a_waiting_acquire_gets_the_lease_when_the_holder_s_expires(server: LeaseServer) -> None:
    with Client(server.url) as client:
        sent = time.monotonic()
        holder = client.acquire("job:wait", 1)
        assert holder is not None
        waiter = client.acquire("job:wait", 30, wait_ms=10_000)
        # The server waits; it hands over at the holder's expiry (by its clock), which is at
        # least the TTL after the holder's request was sent.
        assert waiter is not None and waiter.fence > holder.fence
        assert time.monotonic() - sent >= 1.0


def test_a_wait_that_runs_out_is_none(server: LeaseServer) -> None:
    with Client(server.url) as client:
        assert client.acquire("job:busy", 30) is not None
        started = time.monotonic()
        assert client.acquire("job:busy", 30, wait_ms=300) is None
        assert time.monotonic() - started >= 0.3
        with pytest.raises(NotAcquired) as refused, client.lease("job:busy", 30):
            pass
        assert refused.value.resource == "job:busy"


def test_a_lock_delay_keeps_others_out_after_expiry(server: LeaseServer) -> None:
    with Client(server.url) as client:
        assert client.acquire("job:delay", 1, lock_delay_ms=60_000) is not None
        # The holder's lease expires after 1 s; the lock delay then keeps the waiter out.
        with pytest.raises(NotAcquired) as refused, client.lease("job:delay", 30, wait_ms=2_000):
            pass
        assert refused.value.delayed_until is not None


def test_renew_extends_the_lease_and_keeps_its_fence(server: LeaseServer) -> None:
    with Client(server.url) as client:
        lease = client.acquire("job:renew", 1)
        assert lease is not None
        before = server.inspect("job:renew")
        assert before is not None
        lease.lost.wait(0.3)  # some work: the renewal is sent after it
        lease.renew()
        after = server.inspect("job:renew")
        assert after is not None and after["fence"] == lease.fence
        extended_ms = _ms(after["expires_at"]) - _ms(before["expires_at"])
        assert extended_ms >= 300, f"renewed only {extended_ms} ms later"
        assert lease.remaining > 0.5


def test_a_lease_not_renewed_is_lost_before_another_owner_can_have_it(server: LeaseServer) -> None:
    with Client(server.url) as client:
        lease = client.acquire("job:taken", 2)
        assert lease is not None
        # Another owner waits for it: the server hands it over at the lease's expiry.
        assert client.acquire("job:taken", 30, wait_ms=10_000) is not None
        assert lease.lost.is_set(), "the holder was told before the hand-over"
        with pytest.raises(LeaseLost) as lost:
            lease.renew()
        assert lost.value.reason == "unconfirmed"


def test_a_refused_renewal_signals_the_loss_at_once(start_server: StartServer, database: str) -> None:
    server = start_server(database_url=database)
    with Client(server.url) as client, client.lease("job:refused", 3) as lease:
        # The lease expires in the store (as after a pause): the next renewal, within a
        # second, is refused with 409 lease-expired, long before the local deadline.
        expire_in_store(database, "job:refused")
        assert lease.lost.wait(1.5)
        with pytest.raises(LeaseLost) as lost:
            lease.check()
        assert lost.value.reason == "lease-expired"


def test_release_frees_the_resource(server: LeaseServer) -> None:
    with Client(server.url) as client:
        lease = client.acquire("job:release", 30)
        assert lease is not None
        lease.release()
        assert server.inspect("job:release") is None
        assert lease.lost.is_set()
        lease.release()  # twice: nothing more to do
        with pytest.raises(LeaseLost) as lost:
            lease.renew()
        assert lost.value.reason == "released"
        again = client.acquire("job:release", 30)
        assert again is not None and again.fence > lease.fence


def test_a_block_renews_past_the_ttl_and_releases_at_its_end(server: LeaseServer) -> None:
    with Client(server.url) as client:
        with client.lease("job:long", 2) as lease:
            # 4.5 s of work under a 2 s lease: renewed every third of the TTL meanwhile.
            assert not lease.lost.wait(4.5), "lost during the work"
            lease.check()
            live = server.inspect("job:long")
            assert live is not None and live["fence"] == lease.fence
        assert server.inspect("job:long") is None, "released at the end of the block"


def test_the_lost_signal_fires_within_the_ttl_when_the_server_dies(server: LeaseServer) -> None:
    with Client(server.url) as client:
        with client.lease("job:doomed", 2) as lease:
            assert not lease.lost.wait(0.8), "a first renewal went through"
            server.kill()
            # The last confirmed renewal was sent before the kill: its safe deadline is at
            # most 1.8 s on, the server's expiry at least 2 s.
            assert lease.lost.wait(2.0), "not signalled within the 2 s TTL"
            with pytest.raises(LeaseLost) as lost:
                lease.check()
            assert lost.value.reason == "unconfirmed"
        # Leaving the block raised nothing.


def test_a_store_outage_is_retried_until_it_ends(start_server: StartServer, database: str, caplog: pytest.LogCaptureFixture) -> None:
    server = start_server(database_url=database)
    with Client(server.url) as client, client.lease("job:outage", 6) as lease:
        caplog.set_level(logging.WARNING, logger="fencelock")
        set_connections(database, allowed=False)
        # The next renewal, at most 2 s away, is answered 503 with Retry-After.
        _until(lambda: any("renewal of job:outage failed" in r.getMessage() for r in caplog.records), 4.0)
        assert "503" in caplog.text
        set_connections(database, allowed=True)
        # Retried (honouring Retry-After: 1) and confirmed before the safe deadline.
        _until(lambda: lease.remaining > 4.5, 4.0)
        assert not lease.lost.is_set()


def test_acquire_retries_503_honouring_retry_after_then_is_unavailable(start_server: StartServer, database: str) -> None:
    server = start_server(database_url=database)
    set_connections(database, allowed=False)
    with Client(server.url, retry=RetryPolicy(deadline=2.5)) as client:
        started = time.monotonic()
        with pytest.raises(Unavailable) as unavailable:
            client.acquire("job:503", 30)
        elapsed = time.monotonic() - started
    assert unavailable.value.retry_after == 1.0
    # Three attempts a second apart (Retry-After: 1); a fourth would start after 2.5 s.
    assert 2.0 <= elapsed < 2.5 + 1.0, elapsed


def test_a_dead_server_is_unavailable_within_the_retry_deadline() -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    with Client(url, retry=RetryPolicy(deadline=1.0)) as client:
        started = time.monotonic()
        with pytest.raises(Unavailable):
            client.acquire("job:1", 30)
        with pytest.raises(Unavailable), client.lease("job:1", 30):
            pass
        assert time.monotonic() - started < 2 * 1.0 + 1.0


def test_bearer_tokens(start_server: StartServer, tokens: Callable[..., tuple[Path, list[str]]]) -> None:
    path, (workers, reader) = tokens(
        {"name": "workers", "prefixes": ["job:"], "permissions": ["lock", "read"], "max_leases": 1},
        {"name": "reader", "prefixes": [""], "permissions": ["read"]},
    )
    server = start_server("--auth-file", str(path))
    with Client(server.url) as anonymous, pytest.raises(Forbidden) as refused:
        anonymous.acquire("job:1", 30)
    assert refused.value.status == 401 and refused.value.problem_type == "unauthorized"
    with Client(server.url, token=workers) as client:
        lease = client.acquire("job:1", 30)
        assert lease is not None
        with pytest.raises(QuotaExceeded):
            client.acquire("job:2", 30)
        with pytest.raises(Forbidden) as scope:
            client.acquire("report:1", 30)
        assert scope.value.status == 403 and scope.value.problem_type == "forbidden-scope"
        lease.release()
    with Client(server.url, token=reader) as client, pytest.raises(Forbidden):
        client.acquire("job:1", 30)


def test_signed_fences(start_server: StartServer, tmp_path: Path) -> None:
    key = tmp_path / "fence.key"
    key.write_bytes(bytes(range(32)))
    server = start_server("--fence-key", str(key))
    with Client(server.url) as client, client.lease("job:signed", 30) as lease:
        signature = hmac.new(key.read_bytes(), f"job:signed\n{lease.fence}".encode(), hashlib.sha256).digest()
        assert lease.fence_token == f"{lease.fence}." + base64.urlsafe_b64encode(signature).rstrip(b"=").decode()


def test_bad_requests_are_rejected_not_retried(server: LeaseServer) -> None:
    with Client(server.url) as client:
        with pytest.raises(Rejected) as rejected:
            client.acquire("job:1", 0)
        assert rejected.value.status == 422
        with pytest.raises(ValueError):
            client.acquire("..", 30)
    with pytest.raises(ValueError):
        Client("localhost:8080")


def test_the_owner_secret_is_never_shown(server: LeaseServer) -> None:
    with Client(server.url) as client:
        lease = client.acquire("job:secret", 30)
        assert lease is not None
        assert lease._owner not in repr(lease)
        assert lease._owner not in httpx.get(f"{server.url}/locks/job:secret").text


def _ms(timestamp: object) -> int:
    """Milliseconds of an RFC 3339 timestamp with millisecond precision."""
    from datetime import datetime

    assert isinstance(timestamp, str)
    return round(datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp() * 1000)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def _until(condition: Callable[[], bool], timeout: float) -> None:
    """Polls `condition` until it holds; fails after `timeout` seconds."""
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "not within the time allowed"
        time.sleep(0.02)
