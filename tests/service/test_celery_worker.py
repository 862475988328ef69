"""Done-when 4 of the service issue: a Celery worker on the machine's Redis runs a job; killing the job's
process mid-run leads to a retry and exactly one result."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import func, select

from service.models import Job, Result

REDIS_URL = os.environ.get("FUSIONWATCH_TEST_REDIS_URL")
RESNET = "tests/models/resnet_tiny_opset17.onnx"

pytestmark = pytest.mark.skipif(not REDIS_URL, reason="FUSIONWATCH_TEST_REDIS_URL is not set (CI sets it)")


@pytest.fixture
def service_settings(service_settings):
    # A queue of this test's own, so parallel tests and other workers never take its jobs.
    return service_settings.model_copy(update={"broker_url": REDIS_URL, "machine_class": f"t{uuid.uuid4().hex[:12]}"})


def _start_worker(database_url: str, settings, log: Path) -> subprocess.Popen:
    env = os.environ | {
        "FUSIONWATCH_DATABASE_URL": database_url,
        "FUSIONWATCH_DATA_DIR": str(settings.data_dir),
        "FUSIONWATCH_BROKER_URL": REDIS_URL,
        "FUSIONWATCH_MACHINE_CLASS": settings.machine_class,
    }
    command = [sys.executable, "-m", "celery", "-A", "service.worker.celery_app", "worker",
               "-Q", settings.machine_class, "-c", "1", "-P", "prefork", "--without-heartbeat",
               "--without-gossip", "--without-mingle", "-l", "WARNING"]
    with log.open("w") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)


def _stop(worker: subprocess.Popen) -> None:
    worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(timeout=30)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait(timeout=10)


def _wait(session, job_id: int, states: tuple[str, ...], timeout_s: float, log: Path) -> Job:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        session.rollback()
        job = session.get(Job, job_id)
        session.refresh(job)
        if job.state in states:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} is {job.state}, not {states}, after {timeout_s}s:\n{log.read_text()[-3000:]}")


def _pool_children(worker: subprocess.Popen) -> list[int]:
    return [int(p) for p in Path(f"/proc/{worker.pid}/task/{worker.pid}/children").read_text().split()]


def test_a_celery_worker_runs_a_job_and_a_killed_job_runs_again_once(
    client, session, migrated_database_url, service_settings, tmp_path
):
    settings = {"runs": 3000, "warmup": 0, "levels": ["disabled"], "engines": ["fusionwatch"]}
    client.post("/api/v1/projects", json={"name": "celery", "settings": settings}).raise_for_status()
    log = tmp_path / "worker.log"
    worker = _start_worker(migrated_database_url, service_settings, log)
    try:
        with open(RESNET, "rb") as model:
            upload = client.post("/api/v1/projects/celery/models", files={"file": ("resnet.onnx", model.read())},
                                 data={"commit": "cafe01"})
        assert upload.status_code == 201, upload.text
        [job_id] = [j["id"] for j in client.get(upload.json()["run_url"]).json()["jobs"]]
        _wait(session, job_id, ("running",), 120, log)
        time.sleep(1.0)  # inside the measurement
        children = _pool_children(worker)
        assert children, log.read_text()
        for child in children:
            os.kill(child, signal.SIGKILL)
        job = _wait(session, job_id, ("done", "failed"), 180, log)
        assert (job.state, job.attempts) == ("done", 2), (job.state, job.attempts, job.error, log.read_text()[-3000:])
        assert session.scalar(select(func.count()).select_from(Result).where(Result.job_id == job_id)) == 1
        run = client.get(upload.json()["run_url"]).json()
        assert run["verdict"] == "ok" and run["jobs_done"] == 1
    finally:
        _stop(worker)
