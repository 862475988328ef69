"""`make run`'s two steps, as separate processes: `fusionwatch db upgrade`, then `fusionwatch serve`."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

STARTUP_SECONDS = 60  # imports onnx, the optimizer and FastAPI on a shared, busy machine
FUSIONWATCH = Path(sys.executable).with_name("fusionwatch")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _command(*args: str) -> list[str]:
    # The installed entry point is what `make run` uses; fall back to the module in an uninstalled checkout.
    return [str(FUSIONWATCH), *args] if FUSIONWATCH.is_file() else [sys.executable, "-m", "service.cli", *args]


def test_db_upgrade_then_serve_answers_health_and_an_empty_model_list(tmp_path):
    database = tmp_path / "nested" / "fusionwatch.db"  # a folder that does not exist yet
    env = os.environ | {"FUSIONWATCH_DATABASE_URL": f"sqlite:///{database}", "FUSIONWATCH_LOG_LEVEL": "WARNING"}

    upgrade = subprocess.run(_command("db", "upgrade"), env=env, capture_output=True, text=True, timeout=120)
    assert upgrade.returncode == 0, upgrade.stderr
    assert database.is_file()
    assert "is at migration" in upgrade.stderr

    port = _free_port()
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log:
        server = subprocess.Popen(
            _command("serve", "--port", str(port)), env=env, stdout=log, stderr=subprocess.STDOUT
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
        assert httpx.get(f"{base}/models", timeout=5).json() == {"data": [], "count": 0}
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)
    assert "fusionwatch serving on" in log_path.read_text()


def test_serve_without_db_upgrade_exits_with_the_advice(tmp_path):
    env = os.environ | {"FUSIONWATCH_DATABASE_URL": f"sqlite:///{tmp_path / 'fresh.db'}"}
    server = subprocess.run(
        _command("serve", "--port", str(_free_port())), env=env, capture_output=True, text=True, timeout=120
    )
    assert server.returncode == 2
    assert "run `fusionwatch db upgrade`" in server.stdout + server.stderr
