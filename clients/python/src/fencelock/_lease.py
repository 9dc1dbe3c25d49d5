"""What a lease knows, whichever client holds it: its fence, its owner secret, the safe
deadline of its last confirmed grant, and whether it is lost; and when its background
renewal is to try (`Renewals`). `Lease` (threads) and `AsyncLease` (asyncio) add the waiting
and the signalling on top.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from . import _protocol as wire
from ._timing import Term
from .errors import FencelockError, LeaseLost

log = logging.getLogger("fencelock")

# The reason of a lease given back by its holder; every other reason is a loss.
RELEASED = "released"
# The reason of a lease whose safe deadline passed without a confirmed renewal.
UNCONFIRMED = "unconfirmed"


class LeaseBase:
    """The state of one lease, safe to read and change from any thread."""

    resource: str
    """The locked resource."""
    fence: int
    """The fencing token of this lease (renewals keep it)."""
    fence_token: str
    """What to send as `Fencing-Token` with every protected write: the signed token when the
    server signs fences (`--fence-key`), else the fence as text."""

    def __init__(self, resource: str, owner: str, ttl_seconds: int, grant: wire.Grant, sent: float) -> None:
        self.resource = resource
        self.fence = grant.fence
        self.fence_token = grant.fence_token
        self._owner = owner
        self._ttl_seconds = ttl_seconds
        self._guard = threading.Lock()
        # The server granted the lease only after waiting `waited`, which began after the
        # request was sent: counting from there is later, and still never late.
        self._term = Term.granted(sent + grant.waited, grant.expires_in_ms)
        self._loss: tuple[str, str] | None = None
        self._last_error = "no renewal was confirmed in time"

    def check(self) -> None:
        """Raises `LeaseLost` unless the lease is still held: not lost, and its safe deadline
        not passed (checked on the clock, so it is right even before the background renewal
        or the deadline timer has run). Call it before each protected step."""
        loss = self._loss_now()
        if loss is not None:
            self._lose(*loss)
            raise LeaseLost(self.resource, *loss)

    def _lose_if_due(self) -> bool:
        """Marks the lease lost if it is (past its safe deadline, say); True if it is."""
        loss = self._loss_now()
        if loss is None:
            return False
        self._lose(*loss)
        return True

    @property
    def remaining(self) -> float:
        """Seconds the lease is known to stay held without another renewal (0 once lost)."""
        with self._guard:
            if self._loss is not None:
                return 0.0
            return max(self._term.safe_until - time.monotonic(), 0.0)

    def _loss_now(self) -> tuple[str, str] | None:
        with self._guard:
            if self._loss is None and time.monotonic() >= self._term.safe_until:
                return (UNCONFIRMED, self._last_error)
            return self._loss

    def _confirm(self, sent: float, grant: wire.Grant) -> Term | None:
        """Records a confirmed renewal sent at `sent`; `None` if the lease is lost already
        (a loss is final, whatever answers arrive after it). Of two renewals, the later
        deadline counts: the server extends from when each arrives."""
        term = Term.granted(sent, grant.expires_in_ms)
        with self._guard:
            if self._loss is not None:
                return None
            if term.safe_until > self._term.safe_until:
                self._term = term
            return self._term

    def _renew_request(self) -> tuple[str, dict[str, Any]]:
        return wire.lock_path(self.resource, "/renew"), wire.renew_body(self._owner, self._ttl_seconds, self.fence)

    def _renewed(self, sent: float, answer: wire.Answer) -> bool:
        """Records the answer to a renewal sent at `sent`: True when it extended the lease
        (re-arm the deadline); `LeaseLost`, the lease marked lost, when it was refused."""
        try:
            grant = wire.read_renew(answer, self.resource, self.fence)
        except LeaseLost as loss:
            self._lose(loss.reason, str(loss))
            raise
        return self._confirm(sent, grant) is not None

    def _renewal_failed(self, term: Term, failures: int, error: Exception) -> float:
        """Records the failure of a background renewal; returns when to try again."""
        with self._guard:
            self._last_error = str(error)
        log.warning("renewal of %s failed (%d in a row), retrying: %s", self.resource, failures, error)
        return term.retry_at(failures, time.monotonic(), getattr(error, "retry_after", None))

    def _release_call(self) -> Release | None:
        """The release to make; `None` if released already, `LeaseLost` if lost."""
        known = self._loss_now()
        if known is not None and known[0] == RELEASED:
            return None
        if known is not None:
            self._lose(*known)
            raise LeaseLost(self.resource, *known)
        return Release(self)

    def _lose(self, reason: str, detail: str = "") -> bool:
        """Marks the lease lost (or released) once; True for the call that did. The
        subclass then signals it."""
        with self._guard:
            if self._loss is not None:
                return False
            self._loss = (reason, detail)
        if reason != RELEASED:
            log.warning("lease on %s (fence %d) lost: %s %s", self.resource, self.fence, reason, detail)
        self._signal_lost()
        return True

    def _signal_lost(self) -> None:
        raise NotImplementedError

    @property
    def _term_now(self) -> Term:
        with self._guard:
            return self._term

    def __repr__(self) -> str:
        # Never the owner: it is the holder's secret.
        state = self._loss[0] if self._loss else "held"
        return f"<{type(self).__name__} {self.resource!r} fence={self.fence} {state}>"


class Release:
    """One release call, naming the lease's fence so that it can never free a newer lease.
    A `404` after an attempt whose answer was lost means that attempt released it."""

    def __init__(self, lease: LeaseBase) -> None:
        self._lease = lease
        self._attempts = 0

    def request(self) -> tuple[str, dict[str, Any]]:
        self._attempts += 1
        return wire.lock_path(self._lease.resource), wire.release_body(self._lease._owner, self._lease.fence)

    def read(self, answer: wire.Answer) -> None:
        try:
            wire.read_release(answer, self._lease.resource)
        except LeaseLost as loss:
            if self._attempts > 1 and loss.reason == "not-found":
                return
            self._lease._lose(loss.reason)
            raise


class Renewals:
    """The schedule of a lease's background renewal, the same on a thread and in a task: an
    attempt every third of the granted time; after a failure, retries with backoff until the
    safe deadline."""

    def __init__(self, lease: LeaseBase) -> None:
        self._lease = lease
        self._term = lease._term_now
        """The grant the next attempt renews, as it was when the wait for it began."""
        self._wake = self._term.renew_at
        self._failures = 0

    def pause(self) -> float:
        """How long to wait for the next attempt: until it is due, or until the safe deadline
        if that comes first (the lease is then lost)."""
        self._term = self._lease._term_now
        return max(min(self._wake, self._term.safe_until) - time.monotonic(), 0)

    @contextlib.contextmanager
    def attempt(self) -> Iterator[float]:
        """One attempt, given how long it may take. Its end schedules the next one: after a
        success, a third of the new grant on; after a failure, a retry. A refusal
        (`LeaseLost`) goes through: the renewal is over."""
        try:
            yield self._term.attempt_timeout(time.monotonic())
        except LeaseLost:
            raise
        except FencelockError as error:
            self._failures += 1
            self._wake = self._lease._renewal_failed(self._term, self._failures, error)
        else:
            self._failures = 0
            self._wake = self._lease._term_now.renew_at
