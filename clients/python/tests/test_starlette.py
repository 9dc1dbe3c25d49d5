"""A Starlette service protected by the SQL guard, with `fencelock.starlette`: the
`Fencing-Token` header read, and the guard's refusals answered as the HTTP contract's
problem documents."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import psycopg
from conftest import StartServer, install_guard
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from fencelock import Client
from fencelock.guard import admit
from fencelock.starlette import answer_guard_refusals, fencing_token


def protected_service(database: str) -> Starlette:
    async def put(request: Request) -> JSONResponse:
        key = request.path_params["key"]
        token = fencing_token(request)
        body = await request.body()
        with psycopg.connect(database, autocommit=True) as db, db.transaction():
            fence = admit(db, key, token)
            db.execute(
                "INSERT INTO reports VALUES (%s, %s, %s) ON CONFLICT (id) DO UPDATE"
                " SET body = excluded.body, fence = excluded.fence",
                (key, body.decode(), fence),
            )
        return JSONResponse({"key": key, "fence": fence})

    app = Starlette(routes=[Route("/reports/{key}", put, methods=["PUT"])])
    answer_guard_refusals(app)
    return app


def test_refusals_are_problem_documents(start_server: StartServer, database: str) -> None:
    server = start_server()
    install_guard(database)
    with Client(server.url) as client:
        old = client.acquire("report:1", 2)
        assert old is not None
        new = client.acquire("report:1", 30, wait_ms=10_000)
        assert new is not None

    async def put(headers: dict[str, str]) -> tuple[int, Any]:
        transport = httpx.ASGITransport(app=protected_service(database))
        async with httpx.AsyncClient(transport=transport, base_url="http://service") as service:
            answer = await service.put("/reports/report:1", content=b"text", headers=headers)
        return answer.status_code, answer.json()

    assert asyncio.run(put({"Fencing-Token": new.fence_token})) == (200, {"key": "report:1", "fence": new.fence})
    status, stale = asyncio.run(put({"Fencing-Token": old.fence_token}))
    assert (status, stale["type"], stale["current_fence"]) == (409, "stale-fence", new.fence)
    status, missing = asyncio.run(put({}))
    assert (status, missing["type"]) == (428, "fencing-token-required")
    status, malformed = asyncio.run(put({"Fencing-Token": "twelve"}))
    assert (status, malformed["type"], malformed["instance"]) == (400, "malformed-request", "/reports/report:1")
