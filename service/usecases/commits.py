"""Record commits as CI or GitHub describes them (their ancestry is walked in baselines.py)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Insert, bindparam, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from service.adapters.db import adopt_inserted
from service.errors import Invalid, NotFound
from service.models import Commit, Project
from service.models.base import utc_now
from service.usecases.history_points import render_commit_again

MAX_SHA_CHARS = 64

# A webhook's commit is on the hot path, where building statements and an ORM flush cost more than
# the writes: statements built once, and one Core INSERT ... RETURNING that numbers the arrival itself
# (service/adapters/db.py: adopt_inserted). The INSERT comes first and steps aside for a commit already there
# (ON CONFLICT DO NOTHING on the (project, sha) key), so a new commit, the usual case, costs one
# statement, not a look-up and then the write; a commit seen before is read after the INSERT found it.
_COMMIT_BY_SHA = select(Commit).where(Commit.project_id == bindparam("project_id"), Commit.sha == bindparam("sha"))
_COMMIT_COLUMNS = ("project_id", "sha", "branch", "parents", "message", "author", "timestamp", "created_at")
_NEXT_SEQ = select(func.coalesce(func.max(Commit.seq), 0) + 1).where(Commit.project_id == bindparam("project_id"))


def _insert_commit(dialect_insert) -> Insert:
    return (
        dialect_insert(Commit.__table__)
        .values({name: bindparam(name, type_=Commit.__table__.c[name].type) for name in _COMMIT_COLUMNS}
                | {"seq": _NEXT_SEQ.scalar_subquery()})
        .on_conflict_do_nothing(index_elements=["project_id", "sha"])
        .returning(Commit.__table__.c.id, Commit.__table__.c.seq)
    )


_INSERT_NEW_COMMIT = {"postgresql": _insert_commit(postgresql.insert), "sqlite": _insert_commit(sqlite.insert)}


def record_commit(
    session: Session,
    project: Project,
    sha: str,
    branch: str = "main",
    parents: list[str] | None = None,
    message: str = "",
    author: str = "",
    timestamp: datetime | None = None,
) -> Commit:
    """The project's commit `sha`, inserted if new. A commit seen again keeps what it had and gains
    what it lacked (GitHub may describe a commit CI reported first)."""
    sha = sha.strip()
    if not sha or len(sha) > MAX_SHA_CHARS or not all(c.isalnum() or c in "-_." for c in sha):
        raise Invalid(f"commit sha {sha[:80]!r} must be 1 to {MAX_SHA_CHARS} letters, digits, '-', '_' or '.'")
    parents = [p.strip() for p in (parents or []) if p and p.strip()]
    if len(parents) > 16 or any(len(p) > MAX_SHA_CHARS for p in parents):
        raise Invalid("a commit has at most 16 parents, each a sha of at most 64 characters")
    if timestamp is not None and timestamp.tzinfo is None:
        raise Invalid("commit timestamp must carry a time zone (e.g. 2026-11-24T10:00:00Z)")
    row = {"project_id": project.id, "sha": sha, "branch": (branch or "main")[:255], "parents": parents,
           "message": message[:10_000], "author": author[:255], "timestamp": timestamp, "created_at": utc_now()}
    connection = session.connection()
    inserted = connection.execute(_INSERT_NEW_COMMIT[connection.dialect.name], row).one_or_none()
    if inserted is not None:
        return adopt_inserted(session, Commit(id=inserted.id, seq=inserted.seq, **row))
    commit = session.scalar(_COMMIT_BY_SHA, {"project_id": project.id, "sha": sha})
    shown_filled = bool(not commit.message and message) or (commit.timestamp is None and timestamp is not None)
    commit.parents = commit.parents or parents
    commit.message = commit.message or message[:10_000]
    commit.author = commit.author or author[:255]
    commit.timestamp = commit.timestamp or timestamp
    if shown_filled:  # history points show the message's first line and the time
        render_commit_again(session, commit)
    return commit


def get_commit(session: Session, project: Project, sha: str) -> Commit:
    commit = session.scalar(select(Commit).where(Commit.project_id == project.id, Commit.sha == sha))
    if commit is None:
        commit = session.scalar(
            select(Commit).where(Commit.project_id == project.id, Commit.sha.startswith(sha)).limit(2)
        ) if len(sha) >= 7 else None
    if commit is None:
        raise NotFound(f"project {project.name!r} has no commit {sha[:80]!r}")
    return commit
