"""The answer mapping and the timing rules, as pure functions (no server needed)."""

from __future__ import annotations

import json
import time

import pytest

from fencelock import Forbidden, LeaseLost, NotAcquired, ProtocolError, QuotaExceeded, Rejected, RetryPolicy, Unavailable
from fencelock import _protocol as wire
from fencelock._timing import Term

LOCK = {"resource": "job:1", "owner": "a", "fence": 7, "acquired_at": "x", "expires_at": "y", "expires_in_ms": 60000}


def answer(status: int, body: object = None, **headers: str) -> wire.Answer:
    raw = b"" if body is None else body.encode() if isinstance(body, str) else json.dumps(body).encode()
    return wire.Answer(status, raw, {k.replace("_", "-"): v for k, v in headers.items()})


def problem(kind: str, status: int) -> dict[str, object]:
    return {"type": kind, "title": "t", "status": status, "detail": "d", "instance": "/x"}


def test_acquire_tells_the_lease_from_contention() -> None:
    grant = wire.read_acquire(answer(200, {"acquired": True, "lock": LOCK}), "job:1")
    assert isinstance(grant, wire.Grant)
    assert (grant.fence, grant.fence_token, grant.expires_in_ms, grant.waited) == (7, "7", 60000, 0.0)
    held = wire.read_acquire(answer(200, {"acquired": False, "resource": "job:1"}), "job:1")
    assert isinstance(held, NotAcquired) and held.delayed_until is None
    waited = wire.read_acquire(answer(200, {"acquired": True, "lock": LOCK, "waited_ms": 1200}), "job:1")
    assert isinstance(waited, wire.Grant) and waited.waited == 1.2
    signed = wire.read_acquire(answer(200, {"acquired": True, "lock": {**LOCK, "fence_token": "7.sig"}}), "job:1")
    assert isinstance(signed, wire.Grant) and signed.fence_token == "7.sig"


@pytest.mark.parametrize("status", [500, 502, 503, 504, 408, 429])
def test_outages_are_unavailable(status: int) -> None:
    error = wire.failure(answer(status, problem("store-unavailable", status), retry_after="1"))
    assert isinstance(error, Unavailable) and error.retry_after == 1.0


def test_refusals_are_sorted_by_remedy() -> None:
    assert isinstance(wire.failure(answer(429, problem("quota-exceeded", 429))), QuotaExceeded)
    assert isinstance(wire.failure(answer(401, problem("unauthorized", 401))), Forbidden)
    assert isinstance(wire.failure(answer(403, problem("forbidden-scope", 403))), Forbidden)
    invalid = wire.failure(answer(422, problem("validation-failed", 422)))
    assert isinstance(invalid, Rejected) and not isinstance(invalid, Forbidden) and invalid.status == 422
    assert isinstance(wire.failure(answer(302, "")), ProtocolError)
    with pytest.raises(ProtocolError):
        wire.read_acquire(answer(200, "<html>proxy</html>"), "r")
    with pytest.raises(ProtocolError):
        wire.read_acquire(answer(200, {"acquired": True}), "r")


@pytest.mark.parametrize(
    ("status", "kind", "reason"),
    [(404, "not-found", "not-found"), (409, "lease-expired", "lease-expired"), (409, "owner-mismatch", "owner-mismatch"), (409, "stale-fence", "stale-fence"), (409, "something-new", "something-new")],
)
def test_renew_refusals_are_lease_lost(status: int, kind: str, reason: str) -> None:
    with pytest.raises(LeaseLost) as lost:
        wire.read_renew(answer(status, problem(kind, status)), "job:1", 7)
    assert lost.value.reason == reason


def test_a_renewal_answered_with_another_fence_breaks_the_contract() -> None:
    assert wire.read_renew(answer(200, {"lock": LOCK}), "job:1", 7).fence == 7
    with pytest.raises(ProtocolError):
        wire.read_renew(answer(200, {"lock": LOCK}), "job:1", 8)


def test_release_refusals() -> None:
    wire.read_release(answer(204), "job:1")
    with pytest.raises(LeaseLost) as lost:
        wire.read_release(answer(403, problem("forbidden", 403)), "job:1")
    assert lost.value.reason == "owner-mismatch"
    with pytest.raises(Forbidden):
        wire.read_release(answer(403, problem("forbidden-scope", 403)), "job:1")


def test_names_go_into_the_path_as_one_segment() -> None:
    assert wire.lock_path("job:42@a+b=c~d.e_f-g") == "/locks/job:42@a+b=c~d.e_f-g"
    assert wire.lock_path("a/b c", "/renew") == "/locks/a%2Fb%20c/renew"
    for dots in (".", ".."):
        with pytest.raises(ValueError):
            wire.lock_path(dots)


def test_retry_after_reads_seconds_and_dates() -> None:
    assert wire.retry_after({"retry-after": "3"}) == 3.0
    assert wire.retry_after({}) is None
    assert wire.retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0
    assert wire.retry_after({"retry-after": "soon"}) is None


def test_a_term_renews_at_a_third_and_keeps_a_margin() -> None:
    term = Term.granted(100.0, 3000)
    assert (term.renew_at, term.safe_until, term.interval) == (101.0, 102.7, 1.0)
    assert Term.granted(100.0, 60_000).safe_until == 159.0, "the margin is at most 1 s"
    assert Term.granted(100.0, -5).safe_until == 100.0
    for failures in range(1, 40):
        # Backoff doubles up to half the interval, and honours Retry-After.
        assert term.retry_at(failures, 0.0, None) <= 0.5
    assert term.retry_at(1, 0.0, 1.0) == 1.0


def test_retries_stop_at_the_deadline_and_before_a_retry_after_past_it() -> None:
    policy = RetryPolicy(initial_backoff=0.1, max_backoff=1.0, deadline=10.0)
    assert [policy.ceiling(n) for n in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert RetryPolicy(initial_backoff=0, max_backoff=0).ceiling(0) == 0.001
    retries = policy.start()
    for _ in range(50):
        pause = retries.pause(None)
        assert pause is not None and pause <= 1.0
    assert retries.pause(11.0) is None, "Retry-After reaches past the deadline"
    assert policy.start(until=time.monotonic() - 1).pause(None) is None
