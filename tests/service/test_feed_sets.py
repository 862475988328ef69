"""Feed sets: a model's own .npz inputs, validated on upload with errors naming the input and the problem,
size-limited before they are read, and checked by every job of the model beside the synthesized feeds."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import select

from service.models import Result
from tests.service.jobs import drain

DECODER = Path("tests/models/llama_torchscript_opset14.onnx")
RESNET = Path("tests/models/resnet_tiny_opset17.onnx")
SETTINGS = {"runs": 1, "warmup": 0, "levels": ["extended"], "engines": ["fusionwatch"], "sequence_length": 8}
URL = "/api/v1/projects/p/models/{model}/feed-sets"


def _npz(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _decoder_feeds(batch: int = 2, seq: int = 8) -> dict[str, np.ndarray]:
    mask = np.ones((batch, seq), np.int64)
    mask[0, :3] = 0  # left-padded, as the user's tokenizer pads for generation
    positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
    return {"input_ids": np.arange(batch * seq, dtype=np.int64).reshape(batch, seq), "attention_mask": mask,
            "position_ids": positions}


def _upload(client, data: bytes, name: str = "padded", model: str = DECODER.name):
    return client.post(URL.format(model=model), data={"name": name}, files={"file": ("set.npz", data, "application/octet-stream")})


@pytest.fixture
def project(client):
    assert client.post("/api/v1/projects", json={"name": "p", "settings": SETTINGS}).status_code == 201
    for model in (DECODER, RESNET):
        reply = client.post("/api/v1/projects/p/models", files={"file": (model.name, model.read_bytes())})
        assert reply.status_code == 201, reply.text
    return client


@pytest.mark.parametrize(
    "change, problem",
    [
        (lambda f: f | {"attention_mask": f["attention_mask"].astype(np.float32)},
         "input 'attention_mask' has dtype float32, the model takes int64"),
        (lambda f: {k: v for k, v in f.items() if k != "position_ids"}, "input 'position_ids' is missing"),
        (lambda f: f | {"pixel_values": np.zeros(3, np.float32)}, "input 'pixel_values' is not an input of the model"),
        (lambda f: f | {"input_ids": f["input_ids"][0]}, "input 'input_ids' has rank 1 (shape [8]), the model takes rank 2"),
        (lambda f: f | {"input_ids": f["input_ids"] + 5000},
         "input 'input_ids' holds ids from 5000 to 5015; the embedding table it indexes has 1000 rows"),
    ],
    ids=["dtype", "missing", "unknown", "rank", "vocabulary"],
)
def test_a_feed_set_that_does_not_fit_the_model_is_a_422_naming_the_input(project, change, problem):
    reply = _upload(project, _npz(**change(_decoder_feeds())))
    assert reply.status_code == 422, reply.text
    assert f"feed set 'padded': {problem}" in reply.json()["detail"]


def test_fixed_dimensions_nan_pickles_and_non_archives_are_refused_by_name(project):
    image = np.zeros((1, 3, 32, 32), np.float32)
    reply = _upload(project, _npz(pixel_values=image[:, :, :16]), model=RESNET.name)
    assert reply.status_code == 422 and "has 16 in dimension 2 (shape [1, 3, 16, 32]), the model fixes it at 32" in reply.json()["detail"]
    image[0, 0, 0, 0] = np.nan
    reply = _upload(project, _npz(pixel_values=image), model=RESNET.name)
    assert reply.status_code == 422 and "input 'pixel_values' holds 1 NaN or inf values" in reply.json()["detail"]
    reply = _upload(project, _npz(pixel_values=np.array([{"a": 1}], dtype=object)), model=RESNET.name)
    assert reply.status_code == 422 and "input 'pixel_values' cannot be read" in reply.json()["detail"]
    reply = _upload(project, b"not a zip", model=RESNET.name)
    assert reply.status_code == 422 and "is not an .npz file" in reply.json()["detail"]
    reply = _upload(project, _npz(**_decoder_feeds()), name="synthesized-mine")
    assert reply.status_code == 422 and "not starting with 'synthesized'" in reply.json()["detail"]
    assert _upload(project, _npz(**_decoder_feeds()), model="nope.onnx").status_code == 404


def test_a_feed_set_over_the_limit_is_refused_before_it_is_read(project, monkeypatch):
    monkeypatch.setattr("service.api.routes.feed_sets.MAX_FEED_SET_BYTES", 1000)
    reply = _upload(project, _npz(**_decoder_feeds(batch=8, seq=64)))
    assert reply.status_code == 413 and "over the limit of 1000 bytes" in reply.json()["detail"]
    monkeypatch.setattr("service.adapters.feed_sets.MAX_FEED_SET_BYTES", 10_000)
    # An archive small on the wire (zeros compress) whose arrays declare 98,688 bytes (headers included) once decompressed.
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **{name: np.zeros((8, 512), np.int64) for name in _decoder_feeds()})
    assert len(buffer.getvalue()) < 10_000
    monkeypatch.setattr("service.api.routes.feed_sets.MAX_FEED_SET_BYTES", 10**6)
    reply = _upload(project, buffer.getvalue())
    assert reply.status_code == 422 and "holds 98688 bytes of arrays, over the limit of 10000" in reply.json()["detail"]


def test_every_job_of_the_model_checks_its_feed_sets_and_records_which(project):
    reply = _upload(project, _npz(**_decoder_feeds()))
    assert reply.status_code == 201, reply.text
    assert reply.json()["inputs"] == {"input_ids": "int64[2, 8]", "attention_mask": "int64[2, 8]", "position_ids": "int64[2, 8]"}
    assert project.get(URL.format(model=DECODER.name)).json()["total"] == 1
    payload = {"project": "p", "sha": "c0", "branch": "main", "parents": []}
    files = [("files", (DECODER.name, DECODER.read_bytes(), "application/octet-stream"))]
    assert project.post("/api/v1/webhooks/ci", data={"payload": json.dumps(payload)}, files=files).status_code == 202
    assert drain(project) == 1
    with project.app.state.services.session_factory() as session:
        result = session.scalar(select(Result))
        checks = {c["feed_set"]: c for c in result.numeric_checks}
        assert list(checks) == ["synthesized", "synthesized-left-padded", "synthesized-right-padded", "padded"]
        assert checks["padded"]["ok"] and checks["padded"]["inputs"]["attention_mask"] == "int64[2, 8]"
        assert checks["padded"]["tensors"] > 50 and result.numeric_ok
