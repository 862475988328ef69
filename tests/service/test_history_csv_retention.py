"""GET /projects/{p}/history as CSV (by Accept or ?format=csv), and `keep_samples_commits`: results older
than a series' latest N commits lose their raw samples and keep their statistics."""

from __future__ import annotations

import csv
import io

from sqlalchemy import select

from service.models import Result
from service.usecases.retention import MIN_KEEP_COMMITS

SAMPLES = [1.0, 1.01, 0.99, 1.02, 0.98, 1.0, 1.01, 0.99, 1.0, 1.0]


def _post(client, project: str, index: int, message: str = "") -> None:
    sha = f"{index:040x}"
    document = {
        "project": project,
        "commit": {"sha": sha, "branch": "main", "parents": [f"{index - 1:040x}"] if index else [], "message": message},
        "machine": {"machine_class": "cpu", "cpu": "test cpu", "cores": 2},
        "results": [{"model": "bert.onnx", "engine": "onnxruntime", "engine_version": "1.20.0", "level": "extended",
                     "fusions": {"com.microsoft.BiasGelu": 2, "com.microsoft.Attention": 1}, "execute_ms": SAMPLES,
                     "model_run_ms": SAMPLES}],
    }
    reply = client.post("/api/v1/results", json=document)
    assert reply.status_code == 201, reply.text


def test_history_as_csv_by_accept_header_or_format(client):
    client.post("/api/v1/projects", json={"name": "engine"}).raise_for_status()
    _post(client, "engine", 1, "first")
    _post(client, "engine", 2, "=HYPERLINK(\"http://x\")")
    by_header = client.get("/api/v1/projects/engine/history", headers={"Accept": "text/csv"})
    assert by_header.status_code == 200 and by_header.headers["content-type"].startswith("text/csv")
    by_query = client.get("/api/v1/projects/engine/history", params={"format": "csv"})
    assert by_query.content == by_header.content
    rows = list(csv.DictReader(io.StringIO(by_header.text)))
    assert [row["commit"] for row in rows] == [f"{1:040x}", f"{2:040x}"]
    first = rows[0]
    assert (first["model"], first["engine"], first["level"]) == ("bert.onnx", "onnxruntime", "extended")
    assert first["fused_ops"] == "com.microsoft.Attention=1;com.microsoft.BiasGelu=2" and first["fused_ops_total"] == "3"
    assert float(first["median_ms"]) == 1.0 and first["samples"] == "10" and first["message"] == "first"
    assert rows[1]["message"].startswith("'=HYPERLINK")  # never a formula in a spreadsheet
    assert client.get("/api/v1/projects/engine/history").headers["content-type"] == "application/json"
    assert client.get("/api/v1/projects/engine/history", params={"format": "xml"}).status_code == 422


def test_samples_older_than_the_kept_commits_are_pruned_and_their_statistics_stay(client, session):
    refused = client.post("/api/v1/projects", json={"name": "short", "settings": {"keep_samples_commits": 50}})
    assert refused.status_code == 422 and "keep_samples_commits" in refused.text
    assert MIN_KEEP_COMMITS == 100  # the least the setting takes: the timing alerts' five windows of 20
    client.post("/api/v1/projects", json={"name": "kept", "settings": {"keep_samples_commits": 100}}).raise_for_status()
    for index in range(1, 103):
        _post(client, "kept", index)
    results = session.execute(select(Result).order_by(Result.id)).scalars().all()
    assert len(results) == 102
    assert [bool(r.execute_ms) for r in results] == [False, False] + [True] * 100
    assert all(r.model_run_ms == [] for r in results[:2])
    assert all(r.median_ms == 1.0 and r.p10_ms is not None and r.mad_ms is not None for r in results)
    rows = list(csv.DictReader(io.StringIO(client.get("/api/v1/projects/kept/history", params={"format": "csv"}).text)))
    assert len(rows) == 102 and float(rows[0]["median_ms"]) == 1.0
