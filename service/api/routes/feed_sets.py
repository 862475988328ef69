"""A model's own feed sets: named .npz files of inputs every job of the model checks numerically."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Request, UploadFile
from sqlalchemy import select

from service.api.deps import ServicesDep, SessionDep
from service.api.uploads import read_uploads
from service.auth import may_write_to
from service.core.limits import load_limits
from service.feed_sets import MAX_FEED_SET_BYTES, FeedSetStore
from service.models import FeedSet
from service.usecases import projects
from service.usecases.feed_sets import upload_feed_set
from service.usecases.models import get_model

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
    session: SessionDep,
    services: ServicesDep,
    project: str,
    model: str,
    file: Annotated[UploadFile, File(description="an .npz (numpy.savez) of one array per model input")],
    name: Annotated[str, Form(description="the feed set's name, as results will record it")],
) -> dict[str, Any]:
    [(_, data)] = read_uploads([file], MAX_FEED_SET_BYTES)
    with session.begin():
        found = projects.get_project(session, project)
        may_write_to(request, found)
        feed_set = upload_feed_set(
            session, services.store, FeedSetStore(services.settings.data_dir), load_limits(services.settings),
            found, model, name, data,
        )  # fmt: skip
        return feed_set_dict(feed_set)


@router.get("/projects/{project}/models/{model}/feed-sets")
def read_feed_sets(session: SessionDep, project: str, model: str) -> dict[str, Any]:
    found = get_model(session, projects.get_project(session, project), model)
    rows = list(session.scalars(select(FeedSet).where(FeedSet.model_id == found.id).order_by(FeedSet.id)))
    return {"items": [feed_set_dict(f) for f in rows], "total": len(rows)}
