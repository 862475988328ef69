"""`make run`'s two steps, as separate processes: `fusionwatch db upgrade`, then `fusionwatch serve`, whose
embedded worker process runs the queued jobs."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from tests.service.serving import (
    RESNET,
    api_get,
    api_post,
    free_port,
    fusionwatch_command,
    serving,
    wait_for_run,
)


def _wait_until_running(base: str, run_url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while api_get(f"{base.removesuffix('/api/v1')}{run_url}").json()["jobs"][0]["state"] != "running":
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.1)


def _worker_pids(server: subprocess.Popen) -> list[int]:
    """The server's spawned worker processes (not multiprocessing's resource tracker)."""
    # Every thread's children: the supervisor thread spawns the replacement of a dead worker.
    children = [pid for task in Path(f"/proc/{server.pid}/task").iterdir() for pid in (task / "children").read_text().split()]
    return [int(pid) for pid in children if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]


def test_serve_runs_an_uploaded_commit_in_its_worker_process(tmp_path):
    with serving(tmp_path) as (base, _server):
        assert api_get(f"{base}/projects", timeout=5).json() == {"items": [], "total": 0}
        settings = {"runs": 3, "warmup": 1, "levels": ["disabled", "all"]}
        assert api_post(f"{base}/projects", json={"name": "cnn", "settings": settings}).status_code == 201
        with open(RESNET, "rb") as model:
            upload = api_post(
                f"{base}/projects/cnn/models",
                files={"file": ("resnet.onnx", model.read())},
                data={"commit": "c0ffee1", "branch": "main"},
                timeout=30,
            )
        assert upload.status_code == 201, upload.text
        assert upload.json()["jobs"] == 4
        run = wait_for_run(base, upload.json()["run_url"])
        assert run["verdict"] == "ok", run
        assert run["jobs_done"] == 4
        history = api_get(f"{base}/projects/cnn/history", params={"engine": "fusionwatch", "level": "all"}).json()
        [series] = history["series"]
        [point] = series["points"]
        assert point["commit"] == "c0ffee1" and point["samples"] == 3 and point["median_ms"] > 0
        assert point["fusions"]["com.microsoft.NhwcFusedConv"] == 9


def test_a_job_whose_worker_is_killed_runs_again_and_records_one_result(tmp_path):
    """SIGKILL the worker process mid-job: the supervisor restarts it and the job runs again, once."""
    with serving(tmp_path, FUSIONWATCH_POLL_INTERVAL_S="0.1") as (base, server):
        settings = {"runs": 3000, "warmup": 0, "levels": ["disabled"], "engines": ["fusionwatch"]}
        api_post(f"{base}/projects", json={"name": "slow", "settings": settings}).raise_for_status()
        with open(RESNET, "rb") as model:
            upload = api_post(f"{base}/projects/slow/models", files={"file": ("resnet.onnx", model.read())},
                                data={"commit": "dead01"}, timeout=30)
        run_url = upload.json()["run_url"]
        _wait_until_running(base, run_url)
        time.sleep(1.0)  # inside the measurement
        [worker] = _worker_pids(server)
        os.kill(worker, signal.SIGKILL)
        run = wait_for_run(base, run_url)
        [job] = run["jobs"]
        assert job["state"] == "done" and job["attempts"] == 2, job
        history = api_get(f"{base}/projects/slow/history").json()
        assert [len(s["points"]) for s in history["series"]] == [1]


def test_serve_without_db_upgrade_exits_with_the_advice(tmp_path):
    env = os.environ | {"FUSIONWATCH_DATABASE_URL": f"sqlite:///{tmp_path / 'fresh.db'}"}
    server = subprocess.run(
        fusionwatch_command("serve", "--port", str(free_port())), env=env, capture_output=True, text=True, timeout=120
    )
    assert server.returncode == 2
    assert "run `fusionwatch db upgrade`" in server.stdout + server.stderr


def test_models_that_explode_at_run_time_fail_their_jobs_and_the_worker_carries_on(tmp_path):
    """Range(0, 2e9) and a (1e5,1)+(1,1e5) broadcast: the worker's address space is capped, so the job fails
    with the allocation it could not make, and the next upload still runs."""
    from tests import hostile_models as hostile

    with serving(tmp_path, FUSIONWATCH_JOB_MEMORY_MB="4096", FUSIONWATCH_POLL_INTERVAL_S="0.1") as (base, server):
        settings = {"runs": 1, "warmup": 0, "levels": ["basic"], "engines": ["fusionwatch", "onnxruntime"]}
        api_post(f"{base}/projects", json={"name": "hostile", "settings": settings}).raise_for_status()
        for index, build in enumerate((hostile.huge_range, hostile.lying_broadcast)):
            upload = api_post(f"{base}/projects/hostile/models", data={"commit": f"bad{index}"},
                                files={"file": (f"m{index}.onnx", build().SerializeToString())}, timeout=30)
            assert upload.status_code == 201, upload.text
            run = wait_for_run(base, upload.json()["run_url"])
            assert run["verdict"] == "failed", run
            for job in run["jobs"]:
                assert job["state"] == "failed" and "allocate" in job["error"].lower(), job
        [worker] = _worker_pids(server)
        with open(RESNET, "rb") as model:
            upload = api_post(f"{base}/projects/hostile/models", files={"file": ("resnet.onnx", model.read())},
                                data={"commit": "good"}, timeout=30)
        assert wait_for_run(base, upload.json()["run_url"])["verdict"] == "ok"
        assert _worker_pids(server) == [worker]  # the same process: nothing crashed


def test_a_job_past_the_timeout_is_killed_and_failed_with_its_reason(tmp_path):
    env = {"FUSIONWATCH_JOB_TIMEOUT_S": "2", "FUSIONWATCH_MAX_ATTEMPTS": "1", "FUSIONWATCH_POLL_INTERVAL_S": "0.1"}
    with serving(tmp_path, **env) as (base, server):
        settings = {"runs": 5000, "warmup": 0, "levels": ["disabled"], "engines": ["fusionwatch"]}
        api_post(f"{base}/projects", json={"name": "slow", "settings": settings}).raise_for_status()
        with open(RESNET, "rb") as model:
            upload = api_post(f"{base}/projects/slow/models", files={"file": ("resnet.onnx", model.read())},
                                data={"commit": "t1"}, timeout=30)
        run = wait_for_run(base, upload.json()["run_url"])
        [job] = run["jobs"]
        assert job["state"] == "failed" and "ran past the 2 s job timeout" in job["error"], job
        [alert] = run["alerts"]
        assert alert["kind"] == "job-failure" and "timeout" in alert["message"]
        deadline = time.monotonic() + 30
        while not _worker_pids(server):  # a fresh worker takes the killed one's place
            assert time.monotonic() < deadline, "no worker process after the timeout"
            time.sleep(0.1)


def test_sigterm_lets_the_running_job_finish_before_the_service_exits(tmp_path):
    with serving(tmp_path, FUSIONWATCH_POLL_INTERVAL_S="0.1") as (base, server):
        settings = {"runs": 300, "warmup": 0, "levels": ["disabled"], "engines": ["fusionwatch"]}
        api_post(f"{base}/projects", json={"name": "drain", "settings": settings}).raise_for_status()
        with open(RESNET, "rb") as model:
            upload = api_post(f"{base}/projects/drain/models", files={"file": ("resnet.onnx", model.read())},
                                data={"commit": "d1"}, timeout=30)
        run_url = upload.json()["run_url"]
        _wait_until_running(base, run_url)
        database = tmp_path / "nested" / "fusionwatch.db"
        server.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal it caught, as a process killed by it would.
        assert server.wait(timeout=60) in (0, -signal.SIGTERM)
    from sqlalchemy import create_engine, text

    engine = create_engine(f"sqlite:///{database}")
    with engine.connect() as connection:
        jobs = connection.execute(text("SELECT state, attempts FROM job")).all()
        results = connection.execute(text("SELECT count(*) FROM result")).scalar()
    engine.dispose()
    assert [tuple(j) for j in jobs] == [("done", 1)] and results == 1
