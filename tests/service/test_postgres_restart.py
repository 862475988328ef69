"""A PostgreSQL restart is survived (issue 12, Isolation): while the database is down the API answers
503 and the worker waits; once it is back, requests work again on fresh connections and the job
queued before the outage runs once.

The test starts its own PostgreSQL (initdb in a temporary folder, its own port) so that stopping it
disturbs no other test; it skips where PostgreSQL's server binaries or a `postgres` user are missing.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.service.serving import RESNET, api_get, api_post, free_port, serving, wait_for_run

BINARIES = sorted(Path("/usr/lib/postgresql").glob("*/bin"))


def _server_binaries() -> Path | None:
    if not BINARIES or not (BINARIES[-1] / "initdb").is_file():
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return None
    return BINARIES[-1] if os.geteuid() == 0 and shutil.which("runuser") else None


pytestmark = pytest.mark.skipif(
    _server_binaries() is None,
    reason="needs PostgreSQL's server binaries (/usr/lib/postgresql/*/bin), a postgres user and root to switch to it",
)


class PrivatePostgres:
    """A throwaway PostgreSQL cluster owned by the postgres user, listening on 127.0.0.1:port."""

    def __init__(self, folder: Path, port: int) -> None:
        self.bin, self.folder, self.port = _server_binaries(), folder, port
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"

    def _as_postgres(self, *command: str) -> None:
        done = subprocess.run(["runuser", "-u", "postgres", "--", *command], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr

    def init(self) -> None:
        self._as_postgres(str(self.bin / "initdb"), "-D", str(self.folder / "data"), "-A", "trust", "-U", "postgres")

    def start(self) -> None:
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1"
        self._as_postgres(str(self.bin / "pg_ctl"), "-D", str(self.folder / "data"), "-o", options,
                          "-l", str(self.folder / "server.log"), "-w", "start")

    def stop(self) -> None:
        self._as_postgres(str(self.bin / "pg_ctl"), "-D", str(self.folder / "data"), "-m", "fast", "-w", "stop")


@contextmanager
def _private_postgres() -> Iterator[PrivatePostgres]:
    # Not under pytest's tmp_path: its parents are private to root, and the server runs as postgres.
    folder = Path(tempfile.mkdtemp(prefix="fusionwatch-pg-"))
    shutil.chown(folder, "postgres")
    server = PrivatePostgres(folder, free_port())
    try:
        server.init()
        server.start()
        yield server
    finally:
        subprocess.run(["runuser", "-u", "postgres", "--", str(server.bin / "pg_ctl"), "-D", str(folder / "data"),
                        "-m", "immediate", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(folder, ignore_errors=True)


def _until(condition, timeout_s: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s}s: {what}"
        time.sleep(0.3)


def test_the_service_rides_out_a_postgresql_restart(tmp_path):
    with _private_postgres() as postgres, serving(tmp_path, postgres.url, FUSIONWATCH_POLL_INTERVAL_S="0.2") as (base, server):
        api_post(f"{base}/projects", json={"name": "cnn"}).raise_for_status()
        with open(RESNET, "rb") as handle:
            api_post(f"{base}/projects/cnn/models", files={"file": ("resnet.onnx", handle)},
                     data={"commit": "a" * 40}).raise_for_status()
        first = wait_for_run(base, "/api/v1/runs/1")
        assert first["state"] == "done", first

        postgres.stop()
        down = api_get(f"{base}/projects")
        assert down.status_code == 503, down.text
        assert down.json()["detail"] == "the database is unavailable; try again shortly"
        assert down.headers["retry-after"] == "5"
        time.sleep(2)  # the worker polls (and backs off) against a database that is away
        postgres.start()

        # Old pooled connections are dead; pool_pre_ping replaces them and the first request succeeds.
        assert api_get(f"{base}/projects").json()["total"] == 1
        with open(RESNET, "rb") as handle:
            queued = api_post(f"{base}/projects/cnn/models", files={"file": ("resnet.onnx", handle)},
                              data={"commit": "b" * 40, "parents": "a" * 40})
        assert queued.status_code == 201, queued.text
        second = wait_for_run(base, queued.json()["run_url"])
        assert second["state"] == "done", second
        assert all(job["state"] == "done" and job["attempts"] == 1 for job in second["jobs"]), second["jobs"]
        history = api_get(f"{base}/projects/cnn/history").json()
        assert sorted(len(series["points"]) for series in history["series"]) == [2] * len(history["series"])
        assert server.poll() is None  # the service never went down
        assert httpx.get(f"{base}/health").status_code == 200
    log = (tmp_path / "serve.log").read_text()
    assert "database unavailable" in log and "database reachable again" in log
