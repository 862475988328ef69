"""Results measured elsewhere (client mode: `fusionwatch run --server`), posted as one document."""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, BackgroundTasks, Depends, Request

from service.api.deps import ServicesDep
from service.api.request_bodies import json_document
from service.auth import may_write_to
from service.commands.post_results import post_results
from service.domain.commits import CommitInfo
from service.domain.measurement import Measurement
from service.schemas.requests import ResultIn, ResultsDocument

router = APIRouter(tags=["results"])


@router.post("/results", status_code=201)
def create_results(
    request: Request, services: ServicesDep, background: BackgroundTasks,
    document: Annotated[ResultsDocument, Depends(json_document(ResultsDocument, "results document"))],
) -> dict[str, Any]:
    c = document.commit
    commit = CommitInfo(c.sha, c.branch, c.parents, c.message, c.author, c.timestamp)
    machine = document.machine.model_dump() if document.machine else {}
    results = [(item.model, Measurement(**item.model_dump(exclude={"model", "baseline"}), paired=_posted_pairs(item)))
               for item in document.results]
    return post_results(services, document.project, commit, machine, results, partial(may_write_to, request),
                        background.add_task)


def _posted_pairs(item: ResultIn) -> dict[str, Any] | None:
    """A result's posted baseline samples, paired with its own; the decision is the server's
    (record_result decides them as the worker's own paired measurements)."""
    if item.baseline is None:
        return None
    return {"baseline_commit": item.baseline.commit, "baseline_ms": list(item.baseline.execute_ms),
            "candidate_ms": list(item.execute_ms), "source": "posted"}
