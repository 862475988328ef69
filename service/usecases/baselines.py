"""The baseline of a result: what it is compared with.

The nearest measured ancestor of the result's commit (breadth-first over parents, so another
branch's merge base counts), with the same fingerprint — same model, engine, level, machine class,
threads and inputs. When the walk finds none (a parentless commit, or parents CI never reported),
the latest earlier commit on the same branch, by timestamp or else arrival, stands in.

Both are a few indexed queries whatever the history's length: the walk reads one generation of
parents at a time and stops at the first measured one, so posting the 10,000th commit costs what
posting the 10th did.
"""

from __future__ import annotations

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from service.models import Commit, Result

# A walk this deep without a measured ancestor gives up on ancestry (and falls back to branch order).
MAX_GENERATIONS = 1000


def find_baseline(session: Session, result: Result) -> Result | None:
    nearest = measured_ancestors(session, result, limit=1)
    return nearest[0] if nearest else None


def measured_ancestors(session: Session, result: Result, limit: int) -> list[Result]:
    """Up to `limit` results with this fingerprint on the commit's measured ancestors, nearest first (the
    latest result per commit); when no ancestor is measured, on earlier commits of the branch."""
    commit = session.get(Commit, result.commit_id)
    return _ancestry(session, result, commit, limit) or _earlier_on_branch(session, result, commit, limit)


def _measured(session: Session, result: Result, commit_ids: list[int]) -> dict[int, Result]:
    """The latest result with this fingerprint at each of these commits."""
    rows = session.scalars(
        select(Result)
        .where(Result.fingerprint == result.fingerprint, Result.commit_id.in_(commit_ids), Result.id != result.id)
        .order_by(Result.id)
    ).all()
    return {row.commit_id: row for row in rows}


def _ancestry(session: Session, result: Result, commit: Commit, limit: int) -> list[Result]:
    found: list[Result] = []
    seen = {commit.sha}
    frontier = [sha for sha in dict.fromkeys(commit.parents or []) if sha not in seen]
    for _ in range(MAX_GENERATIONS):
        if not frontier or len(found) >= limit:
            break
        seen.update(frontier)
        rows = session.execute(
            select(Commit.id, Commit.sha, Commit.parents).where(
                Commit.project_id == commit.project_id, Commit.sha.in_(frontier)
            )
        ).all()
        order = {sha: i for i, sha in enumerate(frontier)}
        rows = sorted(rows, key=lambda row: order[row.sha])
        measured = _measured(session, result, [row.id for row in rows]) if rows else {}
        found += [measured[row.id] for row in rows if row.id in measured]  # nearest first, in the parents' order
        frontier = list(dict.fromkeys(sha for row in rows for sha in (row.parents or []) if sha not in seen))
    return found[:limit]


def _earlier_on_branch(session: Session, result: Result, commit: Commit, limit: int) -> list[Result]:
    """By timestamp where this commit has one (ties and untimed commits by arrival), else by arrival;
    the latest result per commit."""
    if commit.timestamp is None:
        earlier = Commit.seq < commit.seq
        order = (Commit.seq.desc(),)
    else:
        earlier = or_(
            Commit.timestamp < commit.timestamp,
            and_(Commit.timestamp == commit.timestamp, Commit.seq < commit.seq),
        )
        order = (Commit.timestamp.desc(), Commit.seq.desc())
    rows = session.scalars(
        select(Result)
        .join(Commit, Commit.id == Result.commit_id)
        .where(
            Result.fingerprint == result.fingerprint,
            Result.id != result.id,
            Commit.project_id == commit.project_id,
            Commit.branch == commit.branch,
            Commit.id != commit.id,
            earlier,
        )
        .order_by(*order, Result.id.desc())
        .limit(limit * 4)  # re-measured commits hold several results; one per commit is kept
    ).all()
    latest: dict[int, Result] = {}
    for row in rows:
        latest.setdefault(row.commit_id, row)
    return list(latest.values())[:limit]
