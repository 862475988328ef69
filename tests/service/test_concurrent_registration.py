"""A machine posted by two requests at once is registered once, and so are a model file and a new model
name uploaded by two requests at once: the request whose insert loses the race (a unique violation,
on PostgreSQL) reads the other's row and goes on in the same transaction."""

from __future__ import annotations

from sqlalchemy import func, select

from service.adapters.db import make_engine, make_session_factory
from service.adapters.storage import ModelStore
from service.core.limits import upload_limits
from service.models import Machine, Model, ModelFile
from service.usecases.models import ingest_upload
from service.usecases.projects import create_project
from service.usecases.results import get_or_create_machine
from tests import hostile_models

DESCRIPTION = {"machine_class": "cpu", "cpu": "Intel(R) Xeon(R) Processor", "cores": 2}


def test_a_machine_registered_meanwhile_is_read_not_a_failure(migrated_database_url, monkeypatch):
    engine = make_engine(migrated_database_url)
    sessions = make_session_factory(engine)
    try:
        with sessions() as session, session.begin():
            first = get_or_create_machine(session, DESCRIPTION)
        with sessions() as session, session.begin():
            # This request looked before the other one's row existed: its lookup finds nothing once.
            _miss_lookup(session, monkeypatch, 1)
            second = get_or_create_machine(session, DESCRIPTION)
            monkeypatch.undo()
            assert second.id == first.id
            # The transaction survived the failed insert: it still writes.
            session.add(Machine(fingerprint="f" * 64, machine_class="cpu"))
        with sessions() as session:
            assert session.scalar(select(func.count()).select_from(Machine)) == 2
    finally:
        engine.dispose()


def _miss_lookup(session, monkeypatch, which: int) -> None:
    """The session's `which`-th scalar lookup from now on finds nothing, as a request that looked
    before a concurrent one's row existed."""
    real_scalar, calls = session.scalar, []

    def scalar(statement, *args, **kwargs):
        calls.append(statement)
        return None if len(calls) == which else real_scalar(statement, *args, **kwargs)

    monkeypatch.setattr(session, "scalar", scalar)


def test_a_file_or_a_model_name_uploaded_meanwhile_is_read_not_a_failure(migrated_database_url, monkeypatch, tmp_path):
    engine = make_engine(migrated_database_url)
    sessions = make_session_factory(engine)
    store, limits = ModelStore(tmp_path), upload_limits()
    first_bytes, second_bytes = (hostile_models.many_nodes(n).SerializeToString() for n in (3, 4))
    try:
        with sessions() as session, session.begin():
            project = create_project(session, "engine")
            first = ingest_upload(session, store, limits, project, [("relu.onnx", first_bytes)])
        # The same file again, its lookup (the first) missing it: the file row is the first upload's.
        with sessions() as session, session.begin():
            _miss_lookup(session, monkeypatch, 1)
            again = ingest_upload(session, store, limits, project, [("relu.onnx", first_bytes)])
            monkeypatch.undo()
            assert (again.file.id, again.file_is_new, again.model.id) == (first.file.id, False, first.model.id)
        # A new file under the name, the model's lookup (the second) missing it: the model is the first's.
        with sessions() as session, session.begin():
            _miss_lookup(session, monkeypatch, 2)
            newer = ingest_upload(session, store, limits, project, [("relu.onnx", second_bytes)])
            monkeypatch.undo()
            assert newer.model.id == first.model.id and newer.file_is_new
        with sessions() as session:
            assert session.scalar(select(func.count()).select_from(Model)) == 1
            assert session.scalar(select(func.count()).select_from(ModelFile)) == 2
            assert session.get(Model, first.model.id).latest_file_id == newer.file.id
    finally:
        engine.dispose()
