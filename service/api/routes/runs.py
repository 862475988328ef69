"""A run's progress and verdict, and a commit's diff against its baselines."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from service.api.deps import SessionDep
from service.queries.history import commit_diff
from service.queries.runs import run_report

router = APIRouter(tags=["runs"])


@router.get("/runs/{run_id}")
def read_run(session: SessionDep, run_id: int) -> dict[str, Any]:
    status, alerts = run_report(session, run_id)
    return {
        "id": status.run.id,
        "project": status.project.name,
        "commit": status.commit.sha,
        "branch": status.commit.branch,
        "trigger": status.run.trigger,
        "state": status.run.state,
        "verdict": status.verdict,
        # The fused-op counts' verdict, known before the timings (service/usecases/fusion_verdict.py).
        "fusions": status.fusions.to_dict(),
        "jobs_total": status.jobs_total,
        "jobs_done": status.jobs_done,
        "jobs_failed": status.jobs_failed,
        "jobs": [
            {"id": job.id, "model": name, "engine": job.engine, "level": job.level, "state": job.state,
             "attempts": job.attempts, "error": job.error}
            for job, name in status.jobs
        ],
        "alerts": alerts,
        "created_at": status.run.created_at.isoformat(),
    }


@router.get("/commits/{sha}/diff")
def read_commit_diff(session: SessionDep, sha: str, project: str) -> dict[str, Any]:
    return commit_diff(session, project, sha)
