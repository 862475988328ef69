"""The baseline of a result: what it is compared with.

The nearest measured ancestor of the result's commit (breadth-first over parents, so another
branch's merge base counts), with the same fingerprint — same model, engine, level, machine class,
threads and inputs. When the walk finds none (a parentless commit, or parents CI never reported),
the latest earlier commit on the same branch, by timestamp or else arrival, stands in.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import Commit, Result
from service.usecases.commits import ancestors, earlier_on_branch


def find_baseline(session: Session, result: Result) -> Result | None:
    commit = session.get(Commit, result.commit_id)
    measured = {
        row.commit_id: row.id
        for row in session.execute(
            select(Result.commit_id, Result.id)
            .where(Result.fingerprint == result.fingerprint, Result.id != result.id, Result.commit_id != commit.id)
            .order_by(Result.id)
        )
    }  # latest result per commit wins (ids ascend)
    if not measured:
        return None
    for candidates in (ancestors(session, commit), earlier_on_branch(session, commit)):
        for ancestor in candidates:
            if ancestor.id in measured:
                return session.get(Result, measured[ancestor.id])
    return None
