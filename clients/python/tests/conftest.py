"""The tests run against the real lease server: the `fencelock` binary that `FENCELOCK_BIN`
names, or the repository's `target/debug/fencelock` (`cargo build -p fencelock-server
--bin fencelock`). Each test starts servers of its own on free ports, on SQLite files in a
temporary directory or on fresh PostgreSQL databases, and kills them (by their own process
id) at its end. A missing binary or an unreachable PostgreSQL fails the tests.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import signal
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest

REPOSITORY = Path(__file__).resolve().parents[3]
START_TIMEOUT = 60.0
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/postgres"


def binary() -> Path:
    path = Path(os.environ.get("FENCELOCK_BIN") or REPOSITORY / "target/debug/fencelock")
    if not path.is_file():
        pytest.fail(
            f"no lease server binary at {path}: build it with `cargo build -p fencelock-server --bin fencelock`, "
            "or set FENCELOCK_BIN",
            pytrace=False,
        )
    return path


class LeaseServer:
    """One `fencelock` process on a free port of 127.0.0.1. Its log (JSON lines) is read on a
    thread of its own to the end, so the pipe never fills; `url` comes from the line that
    says it serves."""

    url: str

    def __init__(self, args: list[str], cwd: Path) -> None:
        # Only the flags configure it, whatever this process's environment holds.
        env = {k: v for k, v in os.environ.items() if not (k.startswith("FENCELOCK_") or k in ("DATABASE_URL", "RUST_LOG"))}
        self.process = subprocess.Popen(
            [str(binary()), "--bind", "127.0.0.1:0", "--log-format", "json", *args],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.log: list[str] = []
        self._serving = threading.Event()
        self._address: str | None = None
        threading.Thread(target=self._read_log, daemon=True).start()
        if not self._serving.wait(START_TIMEOUT) or self._address is None:
            self.kill()
            pytest.fail("the lease server did not start; its log:\n" + "\n".join(self.log), pytrace=False)
        self.url = f"http://{self._address}"

    def _read_log(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.log.append(line.rstrip())
            if not self._serving.is_set():
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if entry.get("message") == "fencelock serving":
                    self._address = entry.get("address")
                    self._serving.set()
        self._serving.set()  # it exited: stop waiting

    def kill(self) -> None:
        """SIGKILL: the process ends at once, answering nothing more."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def inspect(self, resource: str) -> dict[str, object] | None:
        """The live lease as anyone sees it, `None` when there is none."""
        answer = httpx.get(f"{self.url}/locks/{resource}")
        if answer.status_code == 404:
            return None
        answer.raise_for_status()
        body: dict[str, object] = answer.json()
        return body


StartServer = Callable[..., LeaseServer]


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[StartServer]:
    """Starts lease servers for this test: `start_server()` on a SQLite file of its own,
    `start_server(database_url=...)` on PostgreSQL, with any more flags after."""
    servers: list[LeaseServer] = []

    def start(*flags: str, database_url: str | None = None) -> LeaseServer:
        url = database_url or f"sqlite://{tmp_path / f'leases-{len(servers)}.db'}"
        server = LeaseServer(["--database-url", url, *flags], tmp_path)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.kill()


@pytest.fixture
def server(start_server: StartServer) -> LeaseServer:
    return start_server()


def _admin_url() -> str:
    return os.environ.get("FENCELOCK_TEST_DATABASE_URL", DEFAULT_DATABASE_URL)


@pytest.fixture
def database() -> Iterator[str]:
    """A fresh PostgreSQL database, dropped at the end of the test: its URL."""
    name = f"fencelock_client_py_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(_admin_url(), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    parts = urlsplit(_admin_url())
    try:
        yield urlunsplit(parts._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(_admin_url(), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def set_connections(database_url: str, allowed: bool) -> None:
    """Opens or shuts a database to new connections, ending the open ones when shutting
    it: a store outage, as the lease server sees one."""
    name = urlsplit(database_url).path.lstrip("/")
    with psycopg.connect(_admin_url(), autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {"true" if allowed else "false"}')
        if not allowed:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))


def install_guard(database_url: str, *fence_keys: Path) -> None:
    """`fencelock guard install`, as an operator runs it; then the protected table of the
    tests and of the story in docs/client.md."""
    keys = [arg for key in fence_keys for arg in ("--fence-key", str(key))]
    installed = subprocess.run(
        [str(binary()), "guard", "install", "--database-url", database_url, *keys], capture_output=True, text=True
    )
    assert installed.returncode == 0, f"fencelock guard install failed:\n{installed.stderr}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE reports (id text PRIMARY KEY, body text NOT NULL, fence bigint NOT NULL)")


def expire_in_store(database_url: str, resource: str) -> None:
    """Makes the lease on `resource` expire a second ago by the PostgreSQL store's own
    clock, without waiting for it (the way the server's own tests age a lease)."""
    with psycopg.connect(database_url, autocommit=True) as store:
        aged = store.execute("UPDATE leases SET expires_at = now() - interval '1 second' WHERE resource = %s AND ended_at IS NULL", (resource,))
        assert aged.rowcount == 1, f"no lease on {resource} to expire"


@pytest.fixture
def tokens(tmp_path: Path) -> Callable[..., tuple[Path, list[str]]]:
    """Writes an auth file of the given `[[tokens]]` (each a dict of `name`, `prefixes`,
    `permissions`, optional `max_leases`) with fresh secrets: its path and the secrets."""

    def write(*entries: dict[str, object]) -> tuple[Path, list[str]]:
        secrets_, blocks = [], []
        for entry in entries:
            secret = secrets.token_urlsafe(32)
            secrets_.append(secret)
            block = [
                "[[tokens]]",
                f"name = {json.dumps(entry['name'])}",
                f'sha256 = "{hashlib.sha256(secret.encode()).hexdigest()}"',
                f"prefixes = {json.dumps(entry['prefixes'])}",
                f"permissions = {json.dumps(entry['permissions'])}",
            ]
            if "max_leases" in entry:
                block.append(f"max_leases = {entry['max_leases']}")
            blocks.append("\n".join(block))
        path = tmp_path / "auth.toml"
        path.write_text("\n\n".join(blocks) + "\n")
        return path, secrets_

    return write
