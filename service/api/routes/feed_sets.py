"""A model's own feed sets: named .npz files of inputs every job of the model checks numerically."""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Request, UploadFile

from service.api.deps import ServicesDep, SessionDep
from service.api.uploads import read_uploads
from service.auth import may_write_to
from service.commands.upload_feed_set import MAX_FEED_SET_BYTES, upload_feed_set
from service.models import FeedSet
from service.queries.feed_sets import model_feed_sets

router = APIRouter(tags=["feed sets"])


def feed_set_dict(feed_set: FeedSet) -> dict[str, Any]:
    return {
        "name": feed_set.name, "sha256": feed_set.sha256, "size_bytes": feed_set.size_bytes,
        "inputs": feed_set.inputs, "created_at": feed_set.created_at.isoformat(),
    }  # fmt: skip


# A plain `def`: reading and checking the arrays is blocking work.
@router.post("/projects/{project}/models/{model}/feed-sets", status_code=201)
def create_feed_set(
    request: Request,
    services: ServicesDep,
    project: str,
    model: str,
    file: Annotated[UploadFile, File(description="an .npz (numpy.savez) of one array per model input")],
    name: Annotated[str, Form(description="the feed set's name, as results will record it")],
) -> dict[str, Any]:
    [(_, data)] = read_uploads([file], MAX_FEED_SET_BYTES)
    return feed_set_dict(upload_feed_set(services, project, model, name, data, partial(may_write_to, request)))


@router.get("/projects/{project}/models/{model}/feed-sets")
def read_feed_sets(session: SessionDep, project: str, model: str) -> dict[str, Any]:
    rows = model_feed_sets(session, project, model)
    return {"items": [feed_set_dict(f) for f in rows], "total": len(rows)}
