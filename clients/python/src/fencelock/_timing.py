"""When to renew, when a lease must be taken as lost, and how long to retry: the client-side
rules, the same as the Rust client's (`fencelock/src/client/lease.rs`, `retry.rs`).

Every time here is on the monotonic clock (`time.monotonic()`), in seconds. A lease's time
is counted from the instant the request that granted it was *sent*: the server cannot have
started the lease earlier, so a deadline counted from there is never late.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

# The largest safety margin: loss is reported at most this long before the lease's expiry
# (for short TTLs, a tenth of the TTL).
MAX_SAFETY_MARGIN = 1.0

# The first pause after a failed renewal; it doubles, up to half the renewal interval.
FIRST_RETRY = 0.1


@dataclass(frozen=True)
class Term:
    """The timing of one confirmed grant (acquisition or renewal)."""

    safe_until: float
    """Send instant + `expires_in_ms` - margin: past it the lease counts as lost."""
    renew_at: float
    """A third of the granted time after sending, leaving two more chances before expiry."""
    interval: float
    """A third of the granted time; also the longest one renewal request may take."""

    @classmethod
    def granted(cls, sent: float, expires_in_ms: int) -> Term:
        granted = max(expires_in_ms, 0) / 1000
        margin = min(granted / 10, MAX_SAFETY_MARGIN)
        return cls(safe_until=sent + granted - margin, renew_at=sent + granted / 3, interval=granted / 3)

    def retry_at(self, failures: int, now: float, retry_after: float | None) -> float:
        """When to try again after `failures` failed renewals in a row (at least 1): a pause
        from `FIRST_RETRY`, doubling up to half the interval, jittered so the workers of a
        restarted server do not all come back at once; not before the server's
        `Retry-After`. The caller never waits past `safe_until`."""
        cap = max(self.interval / 2, FIRST_RETRY)
        ceiling = min(FIRST_RETRY * 2.0 ** min(failures - 1, 30), cap)
        pause = random.uniform(ceiling / 2, ceiling)
        return now + max(pause, retry_after or 0.0)

    def attempt_timeout(self, now: float) -> float:
        """How long one renewal may take: an interval, and never past the safe deadline."""
        return max(min(max(self.interval, FIRST_RETRY), self.safe_until - now), 0.001)


@dataclass(frozen=True)
class RetryPolicy:
    """How acquire, renew and release retry an outage (`Unavailable`: a transport error, a
    timeout, `5xx`, `408`, `429`).

    The `n`-th pause (from 0) is random between zero and
    `min(max_backoff, initial_backoff * 2**n)` ("full jitter"), and at least the server's
    `Retry-After`. No attempt starts after `deadline` seconds from the first one; an attempt
    that would have to, to honour `Retry-After`, is not made. A lease's own calls also stop
    at its safe deadline.
    """

    initial_backoff: float = 0.1
    max_backoff: float = 1.0
    deadline: float = 5.0

    def ceiling(self, attempt: int) -> float:
        """The largest pause number `attempt` (from 0) may take (at least 1 ms, so a zero
        backoff is never a busy loop)."""
        initial = max(self.initial_backoff, 0.001)
        return min(initial * 2.0 ** min(attempt, 30), max(self.max_backoff, initial))

    def start(self, until: float | None = None, extra: float = 0.0) -> Retries:
        """The retries of one call starting now, ending `deadline` (+ `extra`, the wait of
        a waited acquire) from now or at `until`, whichever is first."""
        end = time.monotonic() + self.deadline + extra
        return Retries(self, end if until is None else min(end, until))


class Retries:
    """The retry state of one call."""

    def __init__(self, policy: RetryPolicy, until: float) -> None:
        self._policy = policy
        self._until = until
        self._done = 0

    def pause(self, retry_after: float | None) -> float | None:
        """How long to pause before the next attempt, or `None` to give up now: the time is
        up, or the server's `Retry-After` reaches past it. A jittered pause is cut short at
        the end, for one last attempt there."""
        left = self._until - time.monotonic()
        if left <= 0 or (retry_after or 0.0) > left:
            return None
        jittered = random.uniform(0, self._policy.ceiling(self._done))
        self._done += 1
        return max(min(jittered, left), retry_after or 0.0)
