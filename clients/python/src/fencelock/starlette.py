"""Starlette and FastAPI, for a protected service: the writer's `Fencing-Token` header, and
the guard's refusals answered with the HTTP contract's problem documents, as the Rust guard
answers them (`428 fencing-token-required`, `409 stale-fence` with `current_fence`, `403
invalid-fence-token`, `400 malformed-request`). Needs Starlette (FastAPI brings it).

    app = FastAPI()
    answer_guard_refusals(app)

    @app.put("/reports/{key}")
    def put(key: str, body: dict, token: str = Depends(fencing_token)):
        with db.transaction():
            fence = admit(db, key, token)  # raises StaleFence, ... : answered as above
            ...
"""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse

from .errors import FencingTokenRequired, InvalidFenceToken, MalformedFenceToken, StaleFence

__all__ = ["FENCING_TOKEN", "answer_guard_refusals", "fencing_token"]

FENCING_TOKEN = "Fencing-Token"
"""The header a writer sends its lease's `fence_token` in."""

# Each refusal's status, problem type and title.
_PROBLEMS: dict[type[Exception], tuple[int, str, str]] = {
    FencingTokenRequired: (428, "fencing-token-required", "Precondition Required"),
    StaleFence: (409, "stale-fence", "Conflict"),
    InvalidFenceToken: (403, "invalid-fence-token", "Forbidden"),
    MalformedFenceToken: (400, "malformed-request", "Bad Request"),
}


def fencing_token(request: Request) -> str:
    """The `Fencing-Token` header as the writer sent it (checked by the guard against the
    key of the write, not here); `FencingTokenRequired` when there is none. A FastAPI
    dependency: `token: str = Depends(fencing_token)`."""
    token = request.headers.get(FENCING_TOKEN)
    if token is None:
        raise FencingTokenRequired(f"a write needs the {FENCING_TOKEN} header: the fence of the writer's lease")
    return token


def answer_guard_refusals(app: Starlette) -> None:
    """Answers `FencingTokenRequired`, `StaleFence`, `InvalidFenceToken` and
    `MalformedFenceToken`, wherever a route raises them, with their problem documents."""
    for kind in _PROBLEMS:
        app.add_exception_handler(kind, _problem)


async def _problem(request: Request, error: Exception) -> JSONResponse:
    status, kind, title = _PROBLEMS[type(error)]
    body: dict[str, Any] = {"type": kind, "title": title, "status": status, "detail": str(error), "instance": request.url.path}
    if isinstance(error, StaleFence) and error.current is not None:
        body["current_fence"] = error.current
    return JSONResponse(body, status_code=status, media_type="application/problem+json")
