"""Client for the fencelock lease server.

`Client` (threads) and `AsyncClient` (asyncio) acquire leases with fencing tokens, renew
them in the background and say when they are lost; `fencelock.guard.admit` checks a fence
in the protected database, in the writing transaction. See docs/client.md.
"""

from ._timing import RetryPolicy
from .aio import AsyncClient, AsyncLease
from .client import Client, Lease
from .errors import (
    FencelockError,
    FencingTokenRequired,
    Forbidden,
    InvalidFenceToken,
    LeaseLost,
    MalformedFenceToken,
    NotAcquired,
    ProtocolError,
    QuotaExceeded,
    Rejected,
    StaleFence,
    Unavailable,
)

__all__ = [
    "AsyncClient",
    "AsyncLease",
    "Client",
    "FencelockError",
    "FencingTokenRequired",
    "Forbidden",
    "InvalidFenceToken",
    "Lease",
    "LeaseLost",
    "MalformedFenceToken",
    "NotAcquired",
    "ProtocolError",
    "QuotaExceeded",
    "Rejected",
    "RetryPolicy",
    "StaleFence",
    "Unavailable",
]
