"""What a lease knows, whichever client holds it: its fence, its owner secret, the safe
deadline of its last confirmed grant, and whether it is lost. `Lease` (threads) and
`AsyncLease` (asyncio) add the renewing and the signalling on top.
"""

from __future__ import annotations

import logging
import threading
import time

from ._protocol import Grant
from ._timing import Term
from .errors import LeaseLost

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

    def __init__(self, resource: str, owner: str, ttl_seconds: int, grant: Grant, sent: float) -> None:
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

    def _confirm(self, sent: float, grant: Grant) -> Term | None:
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

    def _failed(self, error: Exception) -> None:
        with self._guard:
            self._last_error = str(error)

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
