"""A machine posted by two requests at once is registered once: the request whose insert loses the race
(a unique violation, on PostgreSQL) reads the other's row and goes on in the same transaction."""

from __future__ import annotations

from sqlalchemy import func, select

from service.db import make_engine, make_session_factory
from service.models import Machine
from service.usecases.results import get_or_create_machine

DESCRIPTION = {"machine_class": "cpu", "cpu": "Intel(R) Xeon(R) Processor", "cores": 2}


def test_a_machine_registered_meanwhile_is_read_not_a_failure(migrated_database_url, monkeypatch):
    engine = make_engine(migrated_database_url)
    sessions = make_session_factory(engine)
    try:
        with sessions() as session, session.begin():
            first = get_or_create_machine(session, DESCRIPTION)
        with sessions() as session, session.begin():
            # This request looked before the other one's row existed: its lookup finds nothing once.
            real_scalar = session.scalar
            missed = []

            def scalar_missing_once(statement, *args, **kwargs):
                if not missed:
                    missed.append(statement)
                    return None
                return real_scalar(statement, *args, **kwargs)

            monkeypatch.setattr(session, "scalar", scalar_missing_once)
            second = get_or_create_machine(session, DESCRIPTION)
            monkeypatch.undo()
            assert second.id == first.id
            # The transaction survived the failed insert: it still writes.
            session.add(Machine(fingerprint="f" * 64, machine_class="cpu"))
        with sessions() as session:
            assert session.scalar(select(func.count()).select_from(Machine)) == 2
    finally:
        engine.dispose()
