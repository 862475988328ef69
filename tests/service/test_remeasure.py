"""A worker job whose timing alert is only suspected queues its re-measurement, and the re-measurement,
run by the worker like any job, confirms the alert (service/usecases/remeasure.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from sqlalchemy import select

from service.models import Job, Result, Run
from tests.service.jobs import drain

# A model of well under a millisecond: its fastest of 20 runs holds within a few percent however busy
# the machine (BERT's 15 ms runs span several scheduler slices and varied 3× between jobs here).
MODEL = Path("tests/models/resnet_tiny_opset17.onnx")
SETTINGS = {
    "runs": 20, "warmup": 1, "levels": ["disabled"], "engines": ["fusionwatch"], "threads": 1,
    "sequence_length": 16, "timing_threshold_pct": 5,
}
# The window's jobs: a tenth of the first real job's time, each moved by up to ±20%: the window has noise
# of its own (the bar and the agreement both follow it), and the real job and its re-measurement clear
# the bar and agree however busy the test machine is (real jobs here vary up to 2× under load). Twenty of
# them, so that the series' noise (stats.successive_mean_spread, which leaves out the largest tenth of
# the successive differences) leaves out the drop from the first real job to them (with eight it read
# that drop as noise, and the bar then depended on how the machine's load moved the two real jobs), and
# so that the first real job, as slow as the step, is one of 16 jobs the null chance counts
# (timing.null_chance): the step is confirmed on three jobs, the suspected one and two re-measurements.
WINDOW_FACTORS = [0.1 * (1 + 0.2 * ((i * 7) % 5 - 2) / 2) for i in range(20)]


def _ci_commit(client, sha, parents):
    payload = {"project": "p", "sha": sha, "branch": "main", "parents": parents}
    files = [("files", (MODEL.name, MODEL.read_bytes(), "application/octet-stream"))]
    response = client.post("/api/v1/webhooks/ci", data={"payload": json.dumps(payload)}, files=files)
    assert response.status_code == 202, response.text
    return response.json()


def test_a_suspected_timing_alert_of_a_job_is_re_measured_and_confirmed(client):
    assert client.post("/api/v1/projects", json={"name": "p", "settings": SETTINGS}).status_code == 201
    _ci_commit(client, "a0", [])
    assert drain(client) == 1
    services = client.app.state.services
    with services.session_factory() as session:
        real = session.scalar(select(Result))
        measured = dict(engine=real.engine, engine_version=real.engine_version, level=real.level,
                        fusions=real.fusions, graph_hash=real.graph_hash, threads=real.threads, inputs=real.inputs)
        samples, canary = list(real.execute_ms), real.canary_ms
    # Commits a1..a20 were measured elsewhere, ten times as fast, with a slower canary (so the real job's
    # canary never marks it as a slow moment): the next real job is a step of several hundred percent.
    for i, factor in enumerate(WINDOW_FACTORS, start=1):
        reply = client.post("/api/v1/results", json={
            "project": "p", "commit": {"sha": f"a{i}", "parents": [f"a{i - 1}"]},
            "machine": {"machine_class": "cpu"},
            "results": [{"model": MODEL.name, **measured, "execute_ms": [s * factor for s in samples],
                         "canary_ms": canary * 10}],
        })
        assert reply.status_code == 201, reply.text
    run = _ci_commit(client, "a21", ["a20"])
    assert drain(client, limit=1) == 1  # the commit's job: suspected, its re-measurement queued
    [suspected] = client.get("/api/v1/alerts", params={"project": "p", "kind": "timing-regression"}).json()["items"]
    assert suspected["state"] == "suspected"
    waiting = client.get(run["run_url"]).json()
    assert (waiting["state"], waiting["jobs_done"], waiting["jobs_total"]) == ("running", 1, 1)  # a CI step waits on
    # The first re-measurement is past the bar. The series' first job was about as slow as the step: when
    # the step's jobs come out no slower than it, it is one of the 16 jobs the null chance counts, two
    # jobs say too little, and the first re-measurement asks for one more (how the machine's load moved
    # the real jobs decides which; timing.null_chance's own tests pin both).
    remeasured = drain(client)
    assert remeasured in (1, 2)
    alerts = client.get("/api/v1/alerts", params={"project": "p", "kind": "timing-regression"}).json()["items"]
    [alert] = alerts
    assert (alert["commit"], alert["state"], alert["confirmed_by"]) == ("a21", "confirmed", "a21"), alert["message"]
    assert "Confirmed by a re-measurement" in alert["message"]
    settled = client.get(run["run_url"]).json()
    assert (settled["state"], settled["verdict"]) == ("done", "regression")  # the alert belongs to the commit's run
    with services.session_factory() as session:
        triggers = [r.trigger for r in session.scalars(select(Run).order_by(Run.id))]
        remeasure = session.scalar(select(Job).join(Run, Run.id == Job.run_id).where(Run.trigger == "remeasure"))
        assert (remeasure.engine, remeasure.level, remeasure.state) == ("fusionwatch", "disabled", "done")
        assert session.scalar(select(Run).where(Run.id == remeasure.run_id)).state == "done"
    assert triggers.count("remeasure") == remeasured and triggers[-1] == "remeasure"


def test_run_server_re_measures_a_suspected_timing_alert_and_prints_it_confirmed(tmp_path):
    """Client mode: `fusionwatch run --server` re-measures what the reply marks suspected and posts the
    commit again, so the commit's verdict needs no next commit."""
    from tests.service.serving import api_post, fusionwatch_command, serving
    from tests.service.test_cli_run import cli_env

    options = ["--engine", "fusionwatch", "--level", "disabled", "--runs", "20", "--warmup", "1", "--threads", "1",
               "--sequence-length", "16", "--json"]

    def run(base, sha, *parent):
        args = ["run", str(MODEL), "--server", base, "--project", "engine", "--commit", sha, *parent]
        done = subprocess.run(fusionwatch_command(*args, *options), env=cli_env(), capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)

    with serving(tmp_path) as (base, _server):
        api_post(f"{base}/projects", json={"name": "engine"}).raise_for_status()
        [first] = run(base, "e0")["results"]
        for i, factor in enumerate(WINDOW_FACTORS, start=1):
            faster = {**first, "execute_ms": [s * factor for s in first["execute_ms"]], "canary_ms": first["canary_ms"] * 10}
            api_post(f"{base}/results", json={
                "project": "engine", "commit": {"sha": f"e{i}", "parents": [f"e{i - 1}"]},
                "machine": {"machine_class": "cpu"}, "results": [faster],
            }).raise_for_status()
        reply = run(base, "e21", "--parent", "e20")
    [alert] = [a for a in reply["alerts"] if a["kind"] == "timing-regression"]
    assert (alert["commit"], alert["state"], alert["confirmed_by"]) == ("e21", "confirmed", "e21"), alert["message"]
    assert "Confirmed by a re-measurement" in alert["message"]
