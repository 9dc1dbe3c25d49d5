"""The Python story of docs/client.md runs as it is shown, against a live lease server and
a database with the SQL guard (only its two addresses are changed to the test's own)."""

from __future__ import annotations

import re
import subprocess
import sys

import psycopg
from conftest import REPOSITORY, StartServer, install_guard


def blocks(markdown: str, lang: str) -> list[str]:
    """The fenced code blocks of `markdown` whose info string's first word is `lang`."""
    pattern = rf"^```{re.escape(lang)}\b[^\n]*\n(.*?)^```"
    return re.findall(pattern, markdown, flags=re.MULTILINE | re.DOTALL)


def test_the_paused_worker_story_runs_as_shown(start_server: StartServer, database: str) -> None:
    [story] = blocks((REPOSITORY / "docs/client.md").read_text(), "python")
    assert len(story.splitlines()) < 30
    server = start_server()
    install_guard(database)
    script = story.replace("http://127.0.0.1:8080", server.url).replace("postgresql://127.0.0.1/app", database)
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    refused = re.fullmatch(r"refused: fence (\d+) < (\d+)\n", ran.stdout)
    assert refused is not None, ran.stdout
    a, b = int(refused.group(1)), int(refused.group(2))
    assert a < b
    with psycopg.connect(database) as conn:
        assert conn.execute("SELECT body, fence FROM reports").fetchall() == [("final by B", b)]
