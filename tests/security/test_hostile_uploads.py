"""The safe loader at the HTTP layer: every external-data escape and bad input from the security issue,
uploaded the way an attacker would. Each gets a 4xx naming the problem; the planted secret never
appears in a reply, a stored row or a log line; nothing is stored for a refused upload."""

from __future__ import annotations

import io
import logging
import zipfile

import numpy as np
import onnx
import pytest
from sqlalchemy import select, text

from service.models import Base, ModelFile
from tests import hostile_models as hostile
from tests.service.db_fixtures import make_token
from tests.service.jobs import drain


@pytest.fixture
def project(client):
    settings = {"runs": 1, "warmup": 0, "levels": ["basic"], "engines": ["fusionwatch"]}
    assert client.post("/api/v1/projects", json={"name": "p", "settings": settings}).status_code == 201
    return "p"


def _upload(client, project, files, **form):
    return client.post(f"/api/v1/projects/{project}/models", files=files, data=form)


def _every_stored_text(session) -> str:
    """Every row of every table, as text: where a leaked secret would be stored."""
    dumped = []
    for table in Base.metadata.sorted_tables:
        for row in session.execute(select(table)).all():
            dumped.append(repr(tuple(row)))
    return "\n".join(dumped)


def _zip(entries: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def test_every_external_data_escape_is_refused_and_nothing_leaks(client, project, session, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    data_dir = client.app.state.services.settings.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    hostile.plant_secret(data_dir.parent)  # beside the data directory
    replies = []
    for case in hostile.external_data_cases(tmp_path / "cases"):
        # The model arrives alone, or zipped with what its directory held (a symlink travels as its target's bytes
        # only if the attacker had them; the zip carries the weights file where the case has a plain one).
        folder_files = {p.name: p.read_bytes() for p in case.model_path.parent.iterdir() if p.is_file() and not p.is_symlink() and p.name != "model.onnx"}
        model_bytes = case.model_path.read_bytes()
        for files in ([("file", ("model.onnx", model_bytes))],
                      [("file", ("model.zip", _zip({"model.onnx": model_bytes, **folder_files})))]):
            reply = _upload(client, project, files, commit="abc1234")
            replies.append(reply.text)
            assert reply.status_code == 422, (case.name, reply.text)
            detail = reply.json()["detail"]
            assert "tensor 'stolen'" in detail, (case.name, detail)
    # Absolute, '..' and symlink cases name what they are; the directory case too.
    assert any("absolute" in r for r in replies) and any("'..'" in r for r in replies)
    joined = "\n".join(replies)
    assert not hostile.leaks_secret(joined)
    assert not hostile.leaks_secret(caplog.text)
    stored = _every_stored_text(session)
    assert not hostile.leaks_secret(stored)
    assert session.scalar(select(ModelFile.id)) is None  # nothing stored for any refused upload
    assert client.get("/api/v1/runs/1").status_code == 404  # and no run was started


def test_external_data_that_came_with_the_upload_is_stored_beside_the_model_and_runs(client, project, session):
    weights = np.array([0, 1], dtype=np.int64).tobytes()
    model = hostile.model_reading("weights.bin").SerializeToString()
    reply = _upload(client, project, [("file", ("model.onnx", model)), ("data", ("weights.bin", weights))], commit="c1")
    assert reply.status_code == 201, reply.text
    stored = session.scalar(select(ModelFile))
    assert stored.data_files == ["weights.bin"]
    directory = client.app.state.services.store.directory(stored.sha256)
    assert sorted(p.name for p in directory.iterdir()) == ["model.onnx", "weights.bin"]
    assert drain(client) == 1
    run = client.get(reply.json()["run_url"]).json()
    assert run["verdict"] == "ok", run


def test_same_bytes_are_the_same_file(client, project):
    model = hostile.many_nodes(3).SerializeToString()
    first = _upload(client, project, [("file", ("a.onnx", model))]).json()
    second = _upload(client, project, [("file", ("b.onnx", model))]).json()
    assert first["sha256"] == second["sha256"]
    assert (first["file_is_new"], second["file_is_new"]) == (True, False)


@pytest.mark.parametrize(
    "build, status, expected",
    [
        (hostile.duplicate_graph_outputs, 422, "graph output 'y' is listed twice"),
        (hostile.raw_data_of_wrong_size, 422, "raw_data holds 12 bytes"),
    ],
)
def test_malformed_models_are_422_naming_the_problem(client, project, build, status, expected):
    reply = _upload(client, project, [("file", ("m.onnx", build().SerializeToString()))])
    assert reply.status_code == status and expected in reply.json()["detail"], reply.text


def test_not_onnx_and_bad_names_are_422(client, project):
    reply = _upload(client, project, [("file", ("m.onnx", b"\x00garbage"))])
    assert reply.status_code == 422 and "m.onnx: not a readable ONNX model" in reply.json()["detail"]
    reply = _upload(client, project, [("file", ("../../etc/m.onnx", hostile.many_nodes(2).SerializeToString()))])
    assert reply.status_code == 201  # the directory part of a file name is dropped, never used
    assert reply.json()["model"] == "m.onnx"
    reply = _upload(client, project, [("file", (".hidden.onnx", b"x"))])
    assert reply.status_code == 422 and "not allowed" in reply.json()["detail"]


def test_upload_size_and_node_limits_are_named(migrated_database_url, service_settings):
    from fastapi.testclient import TestClient

    from service.app import create_app

    limited = service_settings.model_copy(update={"max_upload_mb": 1, "max_nodes": 1000})
    with TestClient(create_app(migrated_database_url, limited)) as client:
        client.headers["Authorization"] = f"Bearer {make_token(migrated_database_url)}"
        client.post("/api/v1/projects", json={"name": "p"}).raise_for_status()
        _check_limits(client, "p")


def _check_limits(client, project):
    big = onnx.helper.make_model(
        onnx.helper.make_graph(
            [onnx.helper.make_node("Identity", ["w"], ["y"])], "g", [],
            [onnx.helper.make_tensor_value_info("y", 1, None)],
            [onnx.numpy_helper.from_array(np.zeros(300_000, np.float32), "w")],
        )
    ).SerializeToString()
    reply = _upload(client, project, [("file", ("big.onnx", big))])
    assert reply.status_code == 413 and "FUSIONWATCH_MAX_UPLOAD_MB" in reply.json()["detail"]
    reply = _upload(client, project, [("file", ("many.onnx", hostile.many_nodes(1001).SerializeToString()))])
    assert reply.status_code == 422 and "1001 nodes is over the limit of 1000" in reply.json()["detail"]


def test_a_10mb_node_name_is_stored_and_returned_shortened(client, project, session):
    model = hostile.long_names(10_000_000).SerializeToString()
    reply = _upload(client, project, [("file", ("long.onnx", model))], commit="c2")
    assert reply.status_code == 201 and len(reply.text) < 10_000
    assert drain(client) == 1
    run = client.get(reply.json()["run_url"]).json()
    assert run["jobs_done"] == 1
    diff = client.get("/api/v1/commits/c2/diff", params={"project": project})
    assert diff.status_code == 200 and len(diff.text) < 50_000
    row_bytes = session.execute(text("SELECT near_misses, rules, ops_after FROM result")).all()
    assert len(repr(row_bytes)) < 50_000


@pytest.mark.parametrize("build", [hostile.unsqueeze_axes_out_of_range, hostile.transpose_perm_is_string])
def test_models_folding_cannot_evaluate_are_stored_and_their_jobs_end_with_a_reason(client, project, build):
    """Never a 500: the upload is accepted (the graph is well-formed), the worker's optimizer leaves the node
    alone, and the job ends done, or failed with the runtime's reason: the worker itself carries on."""
    reply = _upload(client, project, [("file", ("m.onnx", build().SerializeToString()))], commit="f0")
    assert reply.status_code == 201, reply.text
    assert drain(client) == 1
    run = client.get(reply.json()["run_url"]).json()
    [job] = run["jobs"]
    assert job["state"] in ("done", "failed")
    if job["state"] == "failed":
        assert job["error"] and "Traceback" not in job["error"]
        assert [a["kind"] for a in run["alerts"]] == ["job-failure"]
    # The service still answers and still runs the next job.
    follow = _upload(client, project, [("file", ("ok.onnx", hostile.many_nodes(2).SerializeToString()))], commit="f1")
    assert drain(client) == 1
    assert client.get(follow.json()["run_url"]).json()["verdict"] == "ok"


def test_job_errors_name_the_model_file_relative_to_the_data_directory(client, project, session):
    """GET /runs shows a failed job's reason; the server's absolute data path is no part of it."""
    data_dir = client.app.state.services.settings.data_dir
    broken = _upload(client, project, [("file", ("t.onnx", hostile.transpose_perm_is_string().SerializeToString()))],
                     commit="e0")
    missing = _upload(client, project, [("file", ("gone.onnx", hostile.many_nodes(4).SerializeToString()))],
                      commit="e1")
    stored = client.app.state.services.store.directory(missing.json()["sha256"])
    (stored / "gone.onnx").unlink()  # lost from the disk after its upload
    assert drain(client) >= 2
    errors = [job["error"] for reply in (broken, missing) for job in client.get(reply.json()["run_url"]).json()["jobs"]
              if job["error"]]
    assert any("gone.onnx is missing from models" in e for e in errors), errors
    for error in errors:
        assert str(data_dir) not in error and str(data_dir.resolve()) not in error, error
    alerts = client.get("/api/v1/alerts", params={"kind": "job-failure"}).json()["items"]
    assert alerts and not any(str(data_dir) in a["message"] for a in alerts)


def test_an_external_data_entry_listing_location_twice_is_refused_at_upload(client, project, session):
    """onnxruntime refuses such a file, so its jobs would fail later; the upload fails now, naming the key."""
    model = hostile.model_reading("weights.bin")
    repeated = model.graph.initializer[0].external_data.add()
    repeated.key, repeated.value = "location", "weights.bin"
    weights = np.array([0, 1], dtype=np.int64).tobytes()
    reply = _upload(client, project, [("file", ("model.onnx", model.SerializeToString())),
                                      ("data", ("weights.bin", weights))], commit="twice")
    assert reply.status_code == 422, reply.text
    assert "tensor 'stolen' lists the external-data key 'location' 2 times" in reply.json()["detail"]
    assert session.scalar(select(ModelFile.id)) is None


def test_an_upload_over_its_limit_is_413_by_its_content_length_naming_the_setting(migrated_database_url, service_settings):
    from fastapi.testclient import TestClient

    from service.app import create_app

    limited = service_settings.model_copy(update={"max_upload_mb": 1})
    with TestClient(create_app(migrated_database_url, limited)) as client:
        client.headers["Authorization"] = f"Bearer {make_token(migrated_database_url)}"
        client.post("/api/v1/projects", json={"name": "p"}).raise_for_status()
        reply = _upload(client, "p", [("file", ("big.onnx", b"\0" * (3 * 1024**2)))])
        assert reply.status_code == 413, reply.text
        assert reply.json()["detail"].endswith(f"at most {2 * 1024**2} here (FUSIONWATCH_MAX_UPLOAD_MB)")
