"""The baseline of a result: what it is compared with.

The nearest measured ancestor of the result's commit (breadth-first over parents, so another
branch's merge base counts), with the same fingerprint — same model, engine, level, machine class,
threads and inputs. When the walk finds none (a parentless commit, or parents CI never reported),
the latest earlier commit on the same branch, by timestamp or else arrival, stands in.
"""

from __future__ import annotations

from collections.abc import Iterator

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import Commit, Result
from service.usecases.commits import ancestor_ids, earlier_on_branch


def find_baseline(session: Session, result: Result) -> Result | None:
    return find_baselines(session, [result])[0]


def find_baselines(session: Session, results: list[Result]) -> list[Result | None]:
    """The baseline of each result (None where there is none), in order. Results of one commit share one
    walk of its ancestry, which stops as soon as every one of them has found its baseline."""
    found: dict[int, Result | None] = {result.id: None for result in results}
    by_commit: dict[int, list[Result]] = {}
    for result in results:
        by_commit.setdefault(result.commit_id, []).append(result)
    for commit_id, group in by_commit.items():
        commit = session.get(Commit, commit_id)
        measured = {result.id: _measured(session, result, commit) for result in group}
        pending = [result for result in group if measured[result.id]]
        for candidate in _candidates(session, commit) if pending else ():
            for result in [r for r in pending if candidate in measured[r.id]]:
                found[result.id] = session.get(Result, measured[result.id][candidate])
                pending.remove(result)
            if not pending:
                break
    return [found[result.id] for result in results]


def _candidates(session: Session, commit: Commit) -> Iterator[int]:
    """Commit ids in the order a baseline is looked for: ancestry, then the branch's earlier commits
    (read only if the walk gets that far)."""
    yield from ancestor_ids(session, commit)
    for earlier in earlier_on_branch(session, commit):
        yield earlier.id


def _measured(session: Session, result: Result, commit: Commit) -> dict[int, int]:
    """Commit id → the latest result id in the result's series, other commits only (ids ascend)."""
    return {
        row.commit_id: row.id
        for row in session.execute(
            select(Result.commit_id, Result.id)
            .where(Result.fingerprint == result.fingerprint, Result.id != result.id, Result.commit_id != commit.id)
            .order_by(Result.id)
        )
    }
