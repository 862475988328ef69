"""Fuzzing the JSON bodies of both webhooks and POST /results: a good document with random parts replaced
by random JSON (huge and non-finite numbers, NUL and long strings, deep and wrong shapes), or random JSON
whole. The property: never a 500 (the test client raises the server's exception), and a refused body
(4xx) stores nothing. GitHub deliveries are signed after the edit, so they reach the push's schema.

Examples per body: 40 in `make test`; FUSIONWATCH_FUZZ_EXAMPLES=2000 for a longer hunt.
"""

from __future__ import annotations

import copy
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from service.models import Base
from tests import hostile_models
from tests.security.test_hostile_results import good_document
from tests.service.github_deliveries import SECRET, push_body, signed

EXAMPLES = int(os.environ.get("FUSIONWATCH_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=2**31 - 2, max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e30, 1e300, -0.0, 5e-324]),
    st.text(max_size=40), st.sampled_from(["..", "../../etc/passwd", "nul\0name", "é" * 3, "x" * 70_000, ""]),
)
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)), max_leaves=12)
# Where to edit: a path of keys and indexes, each step taken modulo what is there.
paths = st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=5)
edits = st.lists(st.tuples(paths, json_values), min_size=1, max_size=4)


def _edited(document, edit_list) -> object:
    document = copy.deepcopy(document)
    for path, value in edit_list:
        if not isinstance(document, dict | list) or not document:
            return value
        here = document
        for depth, step in enumerate(path):
            keys = list(here) if isinstance(here, dict) else list(range(len(here)))
            key = keys[step % len(keys)]
            last = depth == len(path) - 1 or not isinstance(here[key], dict | list) or not here[key]
            if last:
                here[key] = value
                break
            here = here[key]
    return document


def _stored(session) -> tuple[int, ...]:
    session.rollback()
    return tuple(session.scalar(select(func.count()).select_from(t)) for t in Base.metadata.sorted_tables)


def _check(reply, before, session) -> None:
    assert reply.status_code < 500, reply.text[:500]
    if reply.status_code >= 400:
        assert reply.json()["detail"] and len(reply.text) < 5_000
        assert _stored(session) == before, reply.text[:300]


@pytest.fixture
def projects(client):
    settings_ = {"levels": ["basic"], "engines": ["fusionwatch"]}
    model = hostile_models.many_nodes(3).SerializeToString()
    for name, secret in (("engine", SECRET), ("ci", None)):
        client.post("/api/v1/projects", json={"name": name, "webhook_secret": secret, "settings": settings_}
                    ).raise_for_status()
        client.post(f"/api/v1/projects/{name}/models", files={"file": ("relu.onnx", model)}).raise_for_status()
    return client


def _body(document, whole) -> bytes:
    return json.dumps(whole if whole is not None else document).encode()


@FUZZ
@given(edit_list=edits, whole=st.one_of(st.none(), json_values))
def test_fuzzed_results_documents_never_500_and_refusals_store_nothing(projects, session, edit_list, whole):
    document = _edited({**good_document(), "project": "engine"}, edit_list)
    before = _stored(session)
    reply = projects.post("/api/v1/results", content=_body(document, whole), headers={"content-type": "application/json"})
    _check(reply, before, session)


@FUZZ
@given(edit_list=edits, whole=st.one_of(st.none(), json_values), delivery=st.integers(0, 10**9))
def test_fuzzed_github_pushes_never_500_and_refusals_store_nothing(projects, session, edit_list, whole, delivery):
    document = _edited(json.loads(push_body("a" * 40, "b" * 40, ["c" * 40, "a" * 40])), edit_list)
    body = _body(document, whole)
    before = _stored(session)
    reply = projects.post("/api/v1/webhooks/github", content=body, headers={
        "X-GitHub-Event": "push", "X-GitHub-Delivery": f"fuzz-{delivery}", "X-Hub-Signature-256": signed(body),
        "Content-Type": "application/json"})
    _check(reply, before, session)


@FUZZ
@given(edit_list=edits, whole=st.one_of(st.none(), json_values))
def test_fuzzed_ci_hooks_never_500_and_refusals_store_nothing(projects, session, edit_list, whole):
    document = _edited({"project": "ci", "sha": "d" * 40, "branch": "main", "parents": ["e" * 40],
                        "message": "m", "author": "Ada", "timestamp": "2026-11-24T10:00:00Z"}, edit_list)
    before = _stored(session)
    reply = projects.post("/api/v1/webhooks/ci", content=_body(document, whole),
                          headers={"content-type": "application/json"})
    _check(reply, before, session)
