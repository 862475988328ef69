"""`fusionwatch worker`: a Celery worker on the machine's Redis runs the jobs `fusionwatch serve` sends it
(what docker-compose.yml's api and worker services do), and refuses to start without a broker."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

from tests.service.serving import RESNET, api_post, fusionwatch_command, serving, wait_for_run

REDIS_URL = os.environ.get("FUSIONWATCH_TEST_REDIS_URL")


@pytest.mark.skipif(not REDIS_URL, reason="FUSIONWATCH_TEST_REDIS_URL names no Redis")
def test_worker_runs_the_jobs_serve_sends_to_its_queue(tmp_path, database_url):
    # A queue of this test's own: other Celery workers on the shared Redis must not take its jobs.
    queue = f"test-{uuid.uuid4().hex[:12]}"
    shared = {"FUSIONWATCH_BROKER_URL": REDIS_URL, "FUSIONWATCH_MACHINE_CLASS": queue}
    with serving(tmp_path, database_url, **shared) as (base, _server):
        env = os.environ | shared | {"FUSIONWATCH_DATABASE_URL": database_url, "FUSIONWATCH_DATA_DIR": str(tmp_path / "data")}
        log_path = tmp_path / "worker.log"
        with log_path.open("w") as log:
            worker = subprocess.Popen(fusionwatch_command("worker", "--queue", queue), env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            settings = {"runs": 2, "warmup": 0, "levels": ["disabled"], "engines": ["fusionwatch"]}
            api_post(f"{base}/projects", json={"name": "cnn", "settings": settings}).raise_for_status()
            with open(RESNET, "rb") as model:
                upload = api_post(f"{base}/projects/cnn/models", files={"file": ("resnet.onnx", model.read())},
                                    data={"commit": "c1"}, timeout=30)
            assert upload.status_code == 201, upload.text
            run = wait_for_run(base, upload.json()["run_url"], timeout_s=240)
            assert run["verdict"] == "ok", (run, log_path.read_text())
            [job] = run["jobs"]
            assert job["state"] == "done" and job["attempts"] == 1
        finally:
            worker.terminate()
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(timeout=10)
    assert f"fusionwatch worker on queue '{queue}'" in log_path.read_text()


def test_worker_without_a_broker_exits_2_saying_what_to_set(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "FUSIONWATCH_BROKER_URL"}
    result = subprocess.run(fusionwatch_command("worker"), env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "FUSIONWATCH_BROKER_URL is not set" in result.stderr
