"""The SQL guard (`fencelock guard install`) called through psycopg 3, its refusals turned
into this package's errors by SQLSTATE. Needs the `guard` extra: `pip install
'fencelock[guard]'`.

The key's guard row stays locked until the transaction ends, so the check and the write are
one atomic step. Call `admit` inside the writing transaction, before the protected write,
in READ COMMITTED (or retry on `40001`); admit several keys in sorted order.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import psycopg

from .errors import FencelockError, InvalidFenceToken, MalformedFenceToken, StaleFence

__all__ = ["admit", "admit_async"]

_ADMIT = "SELECT fencelock_guard.admit(%s, %s)"


def admit(conn: psycopg.Connection[Any], key: str, token: str | int) -> int:
    """Admits `token` (a lease's `fence_token`) for `key` (the lease's resource): the fence
    admitted, or `StaleFence` (`current`: the newer fence) when a newer lease has written,
    `InvalidFenceToken` for a token not signed for `key`, `MalformedFenceToken` for one that
    is not a token. After a refusal the transaction is aborted: roll it back (leaving
    `with conn.transaction():` by the exception does), having written nothing."""
    with _refusals(key):
        return _fence(conn.execute(_ADMIT, (key, str(token))).fetchone())


async def admit_async(conn: psycopg.AsyncConnection[Any], key: str, token: str | int) -> int:
    """`admit` for an `AsyncConnection`."""
    with _refusals(key):
        cursor = await conn.execute(_ADMIT, (key, str(token)))
        return _fence(await cursor.fetchone())


@contextlib.contextmanager
def _refusals(key: str) -> Iterator[None]:
    """Raises the guard's refusals as this package's errors (any other database error as
    it is)."""
    try:
        yield
    except psycopg.Error as error:
        refusal = _refusal(error, key)
        if refusal is None:
            raise
        raise refusal from error


def _fence(row: Any) -> int:
    if row is None or row[0] is None:
        raise FencelockError("fencelock_guard.admit returned no fence")
    return int(row[0])


def _refusal(error: psycopg.Error, key: str) -> FencelockError | None:
    """The guard's refusal as this package's error, or `None` for any other database
    error."""
    message = error.diag.message_primary or str(error)
    if error.sqlstate == "FL409":
        # The guard puts the current fence in DETAIL; its message names it too.
        detail = error.diag.message_detail or ""
        named = re.search(r"current fence is (\d+)", message)
        current = int(detail) if detail.isdigit() else int(named.group(1)) if named else None
        return StaleFence(key, current, message)
    if error.sqlstate == "FL403":
        return InvalidFenceToken(message)
    if error.sqlstate == "FL400":
        return MalformedFenceToken(message)
    return None
