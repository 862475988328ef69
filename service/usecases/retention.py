"""Raw timing samples kept for a project's latest N commits only (its `keep_samples_commits` setting): a
result older than that keeps its statistics (median, p10, p90, MAD, which history and baselines read) and
its fused counts, and loses `execute_ms` and `model_run_ms`, which are most of a result's bytes (100 runs
each). N may not be less than what the timing alerts read (service/usecases/timing_alerts.py
measured_ancestry: five windows of measured ancestors), so pruning never changes a verdict."""

from __future__ import annotations

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from service.domain.timing import DEFAULT_POLICY
from service.models import Commit, Result

MIN_KEEP_COMMITS = DEFAULT_POLICY.window * 5


def prune_samples(session: Session, result: Result, keep_commits: int | None) -> int:
    """Empty the samples of `result`'s series (its fingerprint) at commits older than its latest
    `keep_commits` commits, by arrival; how many results were pruned."""
    if keep_commits is None:
        return 0
    cutoff = session.scalar(
        select(Commit.seq).join(Result, Result.commit_id == Commit.id).where(Result.fingerprint == result.fingerprint)
        .distinct().order_by(Commit.seq.desc()).offset(keep_commits - 1).limit(1)
    )
    if cutoff is None:
        return 0
    older = select(Commit.id).where(Commit.project_id == result.project_id, Commit.seq < cutoff)
    pruned = session.execute(
        update(Result).where(Result.fingerprint == result.fingerprint, Result.commit_id.in_(older),
                             func.json_array_length(Result.execute_ms) + func.json_array_length(Result.model_run_ms) > 0)
        .values(execute_ms=[], model_run_ms=[]).execution_options(synchronize_session=False)
    )
    return pruned.rowcount or 0
