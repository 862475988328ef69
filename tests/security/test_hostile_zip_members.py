"""Zip uploads whose members cannot be read back whole and intact: each answers 422 naming the member,
and nothing is stored (no model file row, nothing under the data directory's models/)."""

from __future__ import annotations

import io
import struct
import zipfile

import pytest
from sqlalchemy import func, select

from service.models import ModelFile, Run
from tests import hostile_models as hostile

LOCAL = b"PK\x03\x04"
CENTRAL = b"PK\x01\x02"


@pytest.fixture
def project(client):
    assert client.post("/api/v1/projects", json={"name": "p"}).status_code == 201
    return "p"


def _zip(data: bytes, method: int = zipfile.ZIP_STORED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=method) as archive:
        archive.writestr("model.onnx", data)
    return buffer.getvalue()


def _patch(archive: bytes, signature: bytes, offset: int, fmt: str, value: int) -> bytes:
    """`value` written at `offset` of the (only) header starting with `signature`."""
    at = archive.index(signature) + offset
    return archive[:at] + struct.pack(fmt, value) + archive[at + struct.calcsize(fmt):]


def _both_headers(archive: bytes, local_offset: int, central_offset: int, fmt: str, value: int) -> bytes:
    return _patch(_patch(archive, LOCAL, local_offset, fmt, value), CENTRAL, central_offset, fmt, value)


def _bad_crc() -> bytes:
    archive = bytearray(_zip(hostile.many_nodes(3).SerializeToString()))
    archive[archive.index(LOCAL) + 30 + len("model.onnx") + 5] ^= 0xFF  # a byte of the stored member
    return bytes(archive)


def _sizes_that_lie() -> bytes:
    """64 MB of zeros (the hostile case had 512 MB) declared as 1,000 bytes in both headers."""
    archive = _zip(b"\0" * (64 * 1024**2), zipfile.ZIP_DEFLATED)
    return _both_headers(archive, 22, 24, "<I", 1000)


def _corrupted_local_header() -> bytes:
    return _patch(_zip(hostile.many_nodes(3).SerializeToString()), LOCAL, 0, "<I", 0x0BADF00D)


def _method_99() -> bytes:
    return _both_headers(_zip(hostile.many_nodes(3).SerializeToString()), 8, 10, "<H", 99)


def _encrypted() -> bytes:
    return _both_headers(_zip(hostile.many_nodes(3).SerializeToString()), 6, 8, "<H", 0x1)


@pytest.mark.parametrize(("build", "expected"), [
    (_bad_crc, "cannot be read (Bad CRC-32"),
    (_sizes_that_lie, "member 'model.onnx'"),
    (_corrupted_local_header, "cannot be read (Bad magic number for file header"),
    (_method_99, "uses compression method 99"),
    (_encrypted, "is encrypted"),
], ids=["bad-crc", "sizes-that-lie", "corrupted-local-header", "method-99", "encrypted"])
def test_an_unreadable_zip_member_is_422_naming_it_and_nothing_is_stored(client, project, session, build, expected):
    reply = client.post(f"/api/v1/projects/{project}/models", files={"file": ("m.zip", build())}, data={"commit": "c1"})
    assert reply.status_code == 422, reply.text
    detail = reply.json()["detail"]
    assert "m.zip: member 'model.onnx'" in detail and expected in detail, detail
    session.rollback()
    assert session.scalar(select(func.count()).select_from(ModelFile)) == 0
    assert session.scalar(select(func.count()).select_from(Run)) == 0
    models = client.app.state.services.store.root
    assert not models.exists() or not [p for p in models.iterdir() if not p.name.startswith(".")]
