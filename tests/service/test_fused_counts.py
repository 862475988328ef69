"""A fused-op count is what the optimized graph runs (optimizer/fused_ops.py): the same for both
engines, for POST /results, and for results stored before the counts meant that (the migration)."""

from __future__ import annotations

import json

from sqlalchemy import text

from service.adapters import migrate
from service.adapters.db import make_engine

OLD_REVISION = "b19f0c7e5a26"  # before fused counts were recounted from the optimized graph


def _post(client, sha, parents, fusions, ops_after):
    document = {
        "project": "exports", "commit": {"sha": sha, "branch": "main", "parents": parents},
        "machine": {"machine_class": "cpu"},
        "results": [{"model": "bert.onnx", "engine": "onnxruntime", "engine_version": "1.32.0", "level": "extended",
                     "fusions": fusions, "ops_after": ops_after, "execute_ms": [1.0, 1.0, 1.0]}],
    }
    reply = client.post("/api/v1/results", json=document)
    assert reply.status_code == 201, reply.text
    return reply.json()


def test_posted_counts_are_recounted_from_the_posted_graph_and_an_exporters_layer_norm_is_no_regression(client):
    client.post("/api/v1/projects", json={"name": "exports"}).raise_for_status()
    # As onnxruntime's client counted before: its own LayerNormalizations at opset 14, none of the
    # exporter's at opset 17, though both graphs run five.
    _post(client, "o14", [], {"LayerNormalization": 5}, {"LayerNormalization": 5, "Add": 19, "Conv": 2})
    reply = _post(client, "o17", ["o14"], {}, {"LayerNormalization": 5, "Add": 19, "Conv": 2})
    assert [a["kind"] for a in reply["alerts"]] == []
    history = client.get("/api/v1/projects/exports/history", params={"model": "bert.onnx"}).json()
    assert [p["fusions"] for s in history["series"] for p in s["points"]] == [{"LayerNormalization": 5}] * 2


def test_the_migration_recounts_stored_results_from_their_graphs(client, migrated_database_url):
    client.post("/api/v1/projects", json={"name": "exports"}).raise_for_status()
    _post(client, "o14", [], {}, {"LayerNormalization": 5, "MatMul": 4, "com.microsoft.BiasGelu": 2})
    without_graph = {"project": "exports", "commit": {"sha": "bare", "branch": "main", "parents": ["o14"]},
                     "results": [{"model": "other.onnx", "engine": "onnxruntime", "engine_version": "1.32.0",
                                  "level": "extended", "fusions": {"Conv": 3}, "execute_ms": [1.0]}]}
    assert client.post("/api/v1/results", json=without_graph).status_code == 201
    migrate.downgrade(OLD_REVISION, migrated_database_url)
    engine = make_engine(migrated_database_url)
    try:
        with engine.begin() as connection:  # the counts as the rule-made counting stored them
            connection.execute(text("UPDATE result SET fusions = :f WHERE ops_after IS NOT NULL AND fusions IS NOT NULL"
                                    " AND id = (SELECT min(id) FROM result)"), {"f": json.dumps({"Reshape": 1})})
            connection.execute(text("DELETE FROM result_fusion"))
        migrate.upgrade(migrated_database_url)
        with engine.connect() as connection:
            stored = {row[0]: json.loads(row[1]) if isinstance(row[1], str) else row[1]
                      for row in connection.execute(text("SELECT id, fusions FROM result ORDER BY id"))}
            rows = sorted(tuple(r) for r in connection.execute(text("SELECT result_id, op, count FROM result_fusion")))
            points = [json.loads(p)["fusions"] for (p,) in connection.execute(text("SELECT point FROM history_point"
                                                                                   " ORDER BY result_id"))]
    finally:
        engine.dispose()
    first, second = sorted(stored)
    assert stored[first] == {"LayerNormalization": 5, "com.microsoft.BiasGelu": 2}
    assert stored[second] == {"Conv": 3}  # posted without a graph: kept as posted
    assert rows == [(first, "LayerNormalization", 5), (first, "com.microsoft.BiasGelu", 2)]
    assert points[0] == {"LayerNormalization": 5, "com.microsoft.BiasGelu": 2}
