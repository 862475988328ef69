"""POST /results (results measured elsewhere), baselines by ancestry and branch order, alert listing,
acknowledgement, history, diff and metrics."""

from __future__ import annotations

import pytest

FUSIONS = {"com.microsoft.BiasGelu": 2, "com.microsoft.SkipLayerNormalization": 4}
STEADY = [1.0, 1.01, 0.99, 1.02, 0.98, 1.0, 1.01, 0.99, 1.0, 1.0]


def _post(client, sha, parents=(), fusions=FUSIONS, samples=STEADY, branch="main", engine_version="1.20.0", **commit):
    document = {
        "project": "engine",
        "commit": {"sha": sha, "branch": branch, "parents": list(parents), **commit},
        "machine": {"machine_class": "cpu", "cpu": "test cpu", "cores": 2},
        "results": [
            {"model": "bert.onnx", "engine": "onnxruntime", "engine_version": engine_version, "level": "extended",
             "fusions": fusions, "execute_ms": samples,
             "near_misses": [{"rule": "BiasGeluFusion", "anchor": "/mlp/Gelu", "step": "gelu",
                              "reason": "consumer Gelu is domain '' opset 20"}] if fusions != FUSIONS else []}
        ],
    }
    reply = client.post("/api/v1/results", json=document)
    assert reply.status_code == 201, reply.text
    return reply.json()


@pytest.fixture
def project(client):
    client.post("/api/v1/projects", json={"name": "engine"}).raise_for_status()


def test_engine_commits_raise_a_fusion_regression_only_where_the_count_dropped(client, project):
    assert _post(client, "v119")["alerts"] == []
    dropped = _post(client, "v120", ["v119"], fusions={"com.microsoft.SkipLayerNormalization": 4}, engine_version="1.20.0")
    [alert] = dropped["alerts"]
    assert alert["kind"] == "fusion-regression" and alert["rule"] == "BiasGeluFusion"
    assert (alert["op"], alert["before"], alert["after"]) == ("com.microsoft.BiasGelu", 2, 0)
    assert (alert["commit"], alert["baseline_commit"]) == ("v120", "v119")
    # Posted without model files: the cause is the posted near misses, and says what it could not look at.
    assert alert["cause_text"] == "Near misses: BiasGeluFusion at /mlp/Gelu: consumer Gelu is domain '' opset 20."
    assert f"Cause: {alert['cause_text']}" in alert["message"]
    assert "no structural diff: the model files were measured elsewhere and not stored" in alert["cause"]["looked_at"]
    assert alert["engines"] == [{"engine": "onnxruntime", "level": "extended"}] and alert["repro_url"] is None
    assert alert["repro_error"] and "not stored" in alert["cost"]["error"]
    fixed = _post(client, "v121", ["v120"])
    [rise] = fixed["alerts"]  # back up: information, not a regression
    assert (rise["kind"], rise["state"]) == ("fusion-change", "info")
    run = client.get(fixed["run_url"]).json()
    assert run["verdict"] == "ok"
    assert client.get(dropped["run_url"]).json()["verdict"] == "regression"
    resolved = client.get(f"/api/v1/alerts/{alert['id']}").json()
    assert (resolved["state"], resolved["resolved_by"]) == ("resolved", "v121")
    assert client.get("/api/v1/alerts/99999").status_code == 404


def test_timing_regression_is_suspected_until_the_next_commit_agrees(client, project):
    # No timing verdict before 4 measured ancestors (timing.decide): the window's noise needs them.
    for number, parents in ((0, []), (1, ["t0"]), (2, ["t1"])):
        assert _post(client, f"t{number}", parents, samples=[s * (1 + 0.001 * number) for s in STEADY])["alerts"] == []
    assert _post(client, "t1b", ["t2"])["alerts"] == []
    assert _post(client, "t2b", ["t1b"], samples=[s * 1.05 for s in STEADY])["alerts"] == []  # under the bar
    [alert] = _post(client, "t3", ["t2b"], samples=[s * 1.5 for s in STEADY])["alerts"]
    assert alert["kind"] == "timing-regression" and alert["state"] == "suspected" and alert["change_pct"] > 40
    [same] = _post(client, "t4", ["t3"], samples=[s * 1.5 for s in STEADY])["alerts"]
    assert same["id"] == alert["id"] and same["state"] == "confirmed" and same["confirmed_by"] == "t4"


def test_parentless_commits_are_ordered_by_timestamp_on_their_branch(client, project):
    _post(client, "late", timestamp="2026-11-24T12:00:00Z")
    _post(client, "early", timestamp="2026-11-24T08:00:00Z", fusions={"com.microsoft.SkipLayerNormalization": 4})
    # "early" is older than "late", so "late" is not its baseline: nothing to compare with, no alert.
    third = _post(client, "latest", timestamp="2026-11-24T13:00:00Z", fusions={})
    # One alert per lost op: BiasGelu and SkipLayerNormalization.
    assert sorted(a["op"] for a in third["alerts"]) == sorted(FUSIONS)
    assert {a["baseline_commit"] for a in third["alerts"]} == {"late"}


def test_a_branch_compares_with_its_merge_base(client, project):
    _post(client, "m1")
    _post(client, "m2", ["m1"], fusions={"com.microsoft.BiasGelu": 2, "com.microsoft.SkipLayerNormalization": 5})
    feature = _post(client, "f1", ["m1"], branch="feature", fusions={"com.microsoft.SkipLayerNormalization": 4})
    [alert] = feature["alerts"]
    assert alert["baseline_commit"] == "m1"  # its ancestor, not main's newer head


def test_alerts_filter_acknowledge_history_diff_and_metrics(client, project):
    _post(client, "a1")
    _post(client, "a2", ["a1"], fusions={})
    listed = client.get("/api/v1/alerts", params={"project": "engine", "kind": "fusion-regression"}).json()
    assert listed["total"] == 2  # one per lost op
    alert_id, other_id = (item["id"] for item in listed["items"])
    acknowledged = client.post(f"/api/v1/alerts/{alert_id}/ack", json={"note": "onnxruntime#1234 filed"}).json()
    assert (acknowledged["state"], acknowledged["acknowledged_note"]) == ("acknowledged", "onnxruntime#1234 filed")
    assert acknowledged["acknowledged_by"] == "test-writer" and acknowledged["acknowledged_at"]
    assert client.post(f"/api/v1/alerts/{other_id}/ack").json()["acknowledged_note"] is None
    assert client.post(f"/api/v1/alerts/{other_id}/ack", json={"note": "x" * 2001}).status_code == 422
    assert client.get("/api/v1/alerts", params={"state": "open"}).json()["total"] == 0
    assert client.get("/api/v1/alerts", params={"state": "acknowledged"}).json()["total"] == 2
    assert client.get("/api/v1/alerts", params={"kind": "nonsense"}).status_code == 422
    assert client.post("/api/v1/alerts/999/ack").status_code == 404

    [series] = client.get("/api/v1/projects/engine/history", params={"model": "bert.onnx"}).json()["series"]
    assert [p["commit"] for p in series["points"]] == ["a1", "a2"]
    assert series["points"][0]["fusions"] == FUSIONS and series["points"][0]["samples"] == len(STEADY)
    diff = client.get("/api/v1/commits/a2/diff", params={"project": "engine"}).json()
    [entry] = diff["models"]
    assert entry["baseline_commit"] == "a1"
    assert entry["fusions"]["com.microsoft.BiasGelu"] == {"before": 2, "after": 0}
    assert entry["kernel_libraries"] == {"before": {}, "after": {}}  # none recorded by this client
    metrics = client.get("/metrics").text
    assert 'fusionwatch_alerts_total{kind="fusion-regression"} 2' in metrics
    assert 'fusionwatch_jobs{state="queued"} 0' in metrics


def test_bad_documents_and_unknown_names_are_named(client, project):
    assert client.get("/api/v1/projects/nope").status_code == 404
    assert client.get("/api/v1/runs/12345").json() == {"detail": "no run 12345"}
    reply = client.post("/api/v1/results", json={"project": "engine", "commit": {"sha": "x"}, "results": [
        {"model": "m.onnx", "engine": "tvm", "engine_version": "1", "level": "all", "fusions": {}}]})
    assert reply.status_code == 422 and "results.0.engine" in reply.json()["detail"]
    reply = client.post("/api/v1/projects", json={"name": "engine"})
    assert reply.status_code == 409
    reply = client.post("/api/v1/projects", json={"name": "x", "settings": {"levels": ["max"]}})
    assert reply.status_code == 422 and "levels" in reply.json()["detail"]
    reply = client.post("/api/v1/projects", json={"name": "a/b"})
    assert reply.status_code == 422
    reply = client.post("/api/v1/webhooks/ci", content=b"[]", headers={"content-type": "application/json"})
    assert reply.status_code == 422 and "CI webhook" in reply.json()["detail"]
    projects = client.get("/api/v1/projects").json()
    assert projects["total"] == 1 and "webhook_secret" not in projects["items"][0]


def test_alerts_reach_slack_and_json_hooks_and_failed_deliveries_are_retried_and_logged(client, project, session):
    from sqlalchemy import select

    from service.models import AlertDelivery
    from tests.service.receiver import Receiver

    with Receiver() as slack, Receiver(status=500) as broken:
        client.post("/api/v1/projects/engine/hooks", json={"url": slack.url, "format": "slack"}).raise_for_status()
        client.post("/api/v1/projects/engine/hooks", json={"url": broken.url, "format": "json"}).raise_for_status()
        _post(client, "h1")
        # Background delivery runs before the TestClient returns.
        _post(client, "h2", ["h1"], fusions={"com.microsoft.SkipLayerNormalization": 4})
        [body] = slack.wait_for(lambda bodies: len(bodies) >= 1)
        assert body["text"].startswith("[fusionwatch] fusion-regression: BiasGeluFusion stopped firing")
        # The cause in the message, and its near misses as a person reads them, one a line.
        assert "Cause: Near misses: BiasGeluFusion at /mlp/Gelu" in body["text"]
        assert body["text"].splitlines()[1] == "• BiasGeluFusion at /mlp/Gelu: consumer Gelu is domain '' opset 20"
        broken.wait_for(lambda bodies: len(bodies) >= 3)
    session.rollback()
    attempts = session.execute(select(AlertDelivery.attempt, AlertDelivery.status_code, AlertDelivery.error)
                               .order_by(AlertDelivery.id)).all()
    assert sorted(attempts, key=lambda a: (a.status_code or 0, a.attempt)) == [
        (1, 200, None), (1, 500, "HTTP 500"), (2, 500, "HTTP 500"), (3, 500, "HTTP 500")
    ]
    assert client.post("/api/v1/projects/engine/hooks", json={"url": "ftp://x"}).status_code == 422


def test_another_engines_loss_where_our_rule_still_fires_says_so_instead_of_our_near_misses(client, project):
    ours = {"BiasGeluFusion": {"fired": 2, "ms": 0.1}, "FastGeluFusion": {"fired": 0, "ms": 0.1}}
    document = lambda sha, parents, fusions, misses: {  # noqa: E731
        "project": "engine", "commit": {"sha": sha, "branch": "main", "parents": parents},
        "results": [{"model": "bert.onnx", "engine": "onnxruntime", "engine_version": "1.32.0", "level": "extended",
                     "fusions": fusions, "execute_ms": STEADY, "rules": ours, "near_misses": misses}]}
    assert client.post("/api/v1/results", json=document("q1", [], FUSIONS, [])).status_code == 201
    # onnxruntime lost BiasGelu; our optimizer, run on the same file and level, still fused it twice,
    # and its only near miss is a FastGelu elsewhere that has nothing to do with it.
    elsewhere = [{"rule": "FastGeluFusion", "anchor": "/pooler/Tanh", "step": "tanh",
                  "reason": "input of Tanh comes from Add, not a Mul by √(2/π)"}]
    reply = client.post("/api/v1/results", json=document("q2", ["q1"], {"com.microsoft.SkipLayerNormalization": 4}, elsewhere))
    [alert] = reply.json()["alerts"]
    assert alert["rule"] == "BiasGeluFusion"
    assert alert["cause_text"] == ("fusionwatch's own optimizer still fires BiasGeluFusion here (2 times, as at the "
                                   "baseline): onnxruntime's BiasGeluFusion stopped where ours did not, so our near "
                                   "misses cannot say why.")
    assert alert["cause"]["near_miss_lines"] == []
    assert [m["anchor"] for m in alert["cause"]["near_misses"]] == ["/pooler/Tanh"]  # kept as evidence
