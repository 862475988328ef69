"""Projects read moments ago are remembered (service/usecases/known_projects.py): a webhook costs no
project query then; an unknown project is asked for every time, and a row edited by hand is read
again once its entry is PROJECT_TTL_S old."""

from __future__ import annotations

import pytest
from sqlalchemy import event, select, update

from service.errors import NotFound
from service.models import Project
from service.usecases.known_projects import PROJECT_TTL_S, KnownProjects
from service.usecases.projects import create_project
from tests.service.test_token_cache import Clock


@pytest.fixture
def project_reads(session):
    """The SELECTs on the project table the session's engine runs, as they run."""
    reads: list[str] = []

    def note(_connection, _cursor, statement, *_args) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "FROM project" in statement:
            reads.append(statement)

    engine = session.get_bind()
    event.listen(engine, "before_cursor_execute", note)
    yield reads
    event.remove(engine, "before_cursor_execute", note)


def test_a_remembered_project_is_not_read_again_until_its_entry_expires(session, project_reads):
    with session.begin():
        created = create_project(session, "bert", "s3cret", {"runs": 7})
    project_reads.clear()
    clock = Clock()
    known = KnownProjects(clock=clock)
    with session.begin():
        first = known.get(session, "bert")
    with session.begin():
        second = known.get(session, "bert")
    assert len(project_reads) == 1
    assert (second.id, second.name, second.webhook_secret, second.settings) == \
        (created.id, "bert", "s3cret", created.settings)
    assert second is not first and second not in session

    # Edited behind the service's back: seen once the entry is PROJECT_TTL_S old, not before.
    with session.begin():
        session.execute(update(Project).where(Project.id == created.id).values(webhook_secret="rotated"))
    session.expunge_all()
    clock.now += PROJECT_TTL_S - 1
    with session.begin():
        assert known.get(session, "bert").webhook_secret == "s3cret"
    clock.now += 2
    with session.begin():
        assert known.get(session, "bert").webhook_secret == "rotated"
    assert len(project_reads) == 2


def test_an_unknown_project_is_never_remembered(session, project_reads):
    known = KnownProjects(clock=Clock())
    with session.begin(), pytest.raises(NotFound, match="no project named 'gpt2'"):
        known.get(session, "gpt2")
    with session.begin():
        create_project(session, "gpt2")
    project_reads.clear()
    with session.begin():
        assert known.get(session, "gpt2").name == "gpt2"
    with session.begin():
        assert known.get(session, "gpt2").name == "gpt2"
    assert len(project_reads) == 1


def test_changing_a_remembered_project_changes_nothing_stored_nor_what_others_get(session):
    with session.begin():
        create_project(session, "resnet", settings={"runs": 5})
    known = KnownProjects(clock=Clock())
    with session.begin():
        known.get(session, "resnet")
    with session.begin():
        mine = known.get(session, "resnet")
        mine.settings["runs"] = 99
        mine.webhook_secret = "mine"
    with session.begin():
        theirs = known.get(session, "resnet")
        assert (theirs.settings["runs"], theirs.webhook_secret) == (5, None)
        stored = session.execute(select(Project.settings, Project.webhook_secret).where(Project.name == "resnet")).one()
    assert (stored.settings["runs"], stored.webhook_secret) == (5, None)
