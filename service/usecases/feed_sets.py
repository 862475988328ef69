"""Upload and list a model's feed sets (service/adapters/feed_sets.py); the worker's read of them for a job."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from optimizer import LoadLimits, ModelLoadError, check_model_file
from service.adapters.feed_sets import FeedSetStore, check_name, read_npz, validate
from service.adapters.storage import ModelStore
from service.errors import Invalid
from service.models import FeedSet, ModelFile, Project
from service.usecases.models import get_model


def upload_feed_set(
    session: Session,
    store: ModelStore,
    feed_store: FeedSetStore,
    limits: LoadLimits,
    project: Project,
    model_name: str,
    name: str,
    data: bytes,
) -> FeedSet:
    """Validate `data` against the model's latest file and store it under `name` (replacing one of that
    name); Invalid names the input and the problem."""
    check_name(name)
    model = get_model(session, project, model_name)
    if model.latest_file_id is None:
        raise Invalid(f"model {model.name!r} has no stored file to check feed set '{name}' against; upload the model first")
    file = session.get(ModelFile, model.latest_file_id)
    graph = check_model_file(store.get(file.sha256, file.filename, file.data_files).path, limits)
    inputs = validate(name, read_npz(name, data), graph)
    sha256 = feed_store.put(data)
    feed_set = session.scalar(select(FeedSet).where(FeedSet.model_id == model.id, FeedSet.name == name))
    if feed_set is None:
        feed_set = FeedSet(project_id=project.id, model_id=model.id, name=name)
        session.add(feed_set)
    feed_set.sha256, feed_set.size_bytes, feed_set.inputs = sha256, len(data), inputs
    session.flush()
    return feed_set


def model_feed_sets(session: Session, model_id: int) -> list[tuple[str, str]]:
    """(name, sha256) of the model's feed sets, in upload order."""
    rows = session.execute(select(FeedSet.name, FeedSet.sha256).where(FeedSet.model_id == model_id).order_by(FeedSet.id))
    return [(name, sha256) for name, sha256 in rows]


def load_for_job(
    feed_store: FeedSetStore, feed_sets: list[tuple[str, str]], model_path: Path, limits: LoadLimits
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, str]]:
    """(usable feed sets, {name: why not}) for the model file a job measures: a set made for an earlier
    file whose inputs have changed is reported, not fed."""
    usable: dict[str, dict[str, np.ndarray]] = {}
    problems: dict[str, str] = {}
    if not feed_sets:
        return usable, problems
    try:
        graph = check_model_file(model_path, limits)
    except ModelLoadError:
        return usable, problems  # the job itself fails on this, with the loader's message
    for name, sha256 in feed_sets:
        try:
            arrays = feed_store.load(name, sha256)
            validate(name, arrays, graph)
        except (Invalid, OSError) as error:
            problems[name] = str(error)
            continue
        usable[name] = arrays
    return usable, problems
