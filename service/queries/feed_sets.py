"""A model's own feed sets, oldest first."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import FeedSet
from service.usecases.models import get_model
from service.usecases.projects import get_project


def model_feed_sets(session: Session, project: str, model: str) -> list[FeedSet]:
    found = get_model(session, get_project(session, project), model)
    return list(session.scalars(select(FeedSet).where(FeedSet.model_id == found.id).order_by(FeedSet.id)))
