"""Serving the app as `make run` does, for the tests that need real processes: `fusionwatch db upgrade`,
`fusionwatch token create`, `fusionwatch serve` on a free port, and requests with the token it made."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

STARTUP_SECONDS = 60  # imports onnx, the optimizer and FastAPI on a shared, busy machine
FUSIONWATCH = Path(sys.executable).with_name("fusionwatch")
RESNET = "tests/models/resnet_tiny_opset17.onnx"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def api_get(url: str, **kwargs) -> httpx.Response:
    """httpx.get with the served app's token (`serving` puts it in FUSIONWATCH_TOKEN, where the CLI reads it)."""
    return httpx.get(url, headers=_authorization(), **kwargs)


def api_post(url: str, **kwargs) -> httpx.Response:
    return httpx.post(url, headers=_authorization(), **kwargs)


def _authorization() -> dict[str, str]:
    return {"Authorization": f"Bearer {os.environ['FUSIONWATCH_TOKEN']}"}


def fusionwatch_command(*args: str) -> list[str]:
    # The installed entry point is what `make run` uses; fall back to the module in an uninstalled checkout.
    return [str(FUSIONWATCH), *args] if FUSIONWATCH.is_file() else [sys.executable, "-m", "service.cli", *args]


@contextmanager
def serving(tmp_path, database_url: str | None = None, **env_overrides):
    """`fusionwatch db upgrade`, `fusionwatch token create`, then `fusionwatch serve` on a fresh database
    (default: SQLite in a folder that does not exist yet); yields (base URL, server) with the write token
    in FUSIONWATCH_TOKEN for the test's own requests (api_get, api_post) and the CLI it starts."""
    database = tmp_path / "nested" / "fusionwatch.db"
    url = database_url or f"sqlite:///{database}"
    env = os.environ | {"FUSIONWATCH_DATABASE_URL": url, "FUSIONWATCH_LOG_LEVEL": "WARNING"}
    env |= env_overrides
    upgrade = subprocess.run(fusionwatch_command("db", "upgrade"), env=env, capture_output=True, text=True, timeout=120)
    assert upgrade.returncode == 0, upgrade.stderr
    assert database_url or database.is_file()
    assert "is at migration" in upgrade.stderr
    created = subprocess.run(fusionwatch_command("token", "create", "test-admin"), env=env, capture_output=True, text=True,
                             timeout=120)
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    assert token.startswith("fw_") and token not in created.stderr
    previous_token = os.environ.get("FUSIONWATCH_TOKEN")
    os.environ["FUSIONWATCH_TOKEN"] = token

    port = free_port()
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log:
        server = subprocess.Popen(
            fusionwatch_command("serve", "--port", str(port), "--data-dir", str(tmp_path / "data")),
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        base = f"http://127.0.0.1:{port}/api/v1"
        deadline = time.monotonic() + STARTUP_SECONDS
        health = None
        while time.monotonic() < deadline and server.poll() is None:
            try:
                health = httpx.get(f"{base}/health", timeout=2)
                break
            except httpx.TransportError:
                time.sleep(0.25)
        assert health is not None, f"no answer within {STARTUP_SECONDS}s:\n{log_path.read_text()}"
        assert health.status_code == 200 and health.json()["status"] == "ok"
        yield base, server
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)
        if previous_token is None:
            os.environ.pop("FUSIONWATCH_TOKEN", None)
        else:
            os.environ["FUSIONWATCH_TOKEN"] = previous_token
    log = log_path.read_text()
    assert "fusionwatch serving on" in log
    assert token not in log


def wait_for_run(base: str, run_url: str, timeout_s: float = 180) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = api_get(f"{base.removesuffix('/api/v1')}{run_url}", timeout=5).json()
        if run["state"] != "running":
            return run
        time.sleep(0.3)
    raise AssertionError(f"run {run_url} still running after {timeout_s}s: {run}")
