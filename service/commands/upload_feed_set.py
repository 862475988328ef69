"""A feed set is uploaded: named inputs (an .npz) every job of one model then checks numerically."""

from __future__ import annotations

from collections.abc import Callable

from service.adapters.feed_sets import MAX_FEED_SET_BYTES, FeedSetStore
from service.models import FeedSet, Project
from service.services import Services
from service.usecases.feed_sets import upload_feed_set as store_feed_set
from service.usecases.projects import get_project

__all__ = ["MAX_FEED_SET_BYTES", "upload_feed_set"]  # the limit is what the route reads of an upload


def upload_feed_set(
    services: Services, project: str, model: str, name: str, data: bytes, authorize: Callable[[Project], None],
) -> FeedSet:
    with services.session_factory() as session, session.begin():
        found = get_project(session, project)
        authorize(found)
        return store_feed_set(session, services.store, FeedSetStore(services.settings.data_dir),
                              services.upload_limits.load, found, model, name, data)
