"""A commit arrives with (or without) model files: record it, store the files, start its run."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from service.adapters.storage import ModelStore
from service.core.limits import UploadLimits
from service.domain.commits import CommitInfo
from service.errors import Invalid
from service.models import Commit, Job, Model, Project, Run
from service.usecases.commits import record_commit
from service.usecases.models import Ingested, ingest_upload, project_models
from service.usecases.runs import start_run


@dataclass
class Submission:
    commit: Commit
    run: Run | None
    jobs: list[Job]
    ingested: list[Ingested]


def submit_commit(
    session: Session,
    store: ModelStore,
    limits: UploadLimits,
    project: Project,
    info: CommitInfo,
    uploads: list[tuple[str | None, list[tuple[str, bytes]]]],
    trigger: str,
    machine_class: str = "cpu",
    all_models_when_none: bool = True,
) -> Submission:
    """Uploads are (model name or None, files); with none, the project's registered models run again
    (the engine changed, not the model)."""
    ingested = [ingest_upload(session, store, limits, project, files, name) for name, files in uploads]
    commit = record_commit(session, project, info.sha, info.branch, info.parents, info.message, info.author, info.timestamp)
    models: list[Model] = [i.model for i in ingested]
    if not models and all_models_when_none:
        models = [m for m in project_models(session, project) if m.latest_file_id is not None]
        if not models:
            raise Invalid(f"project {project.name!r} has no uploaded models yet; upload one with the commit")
    run, jobs = start_run(session, project, commit, trigger, models, machine_class) if models else (None, [])
    return Submission(commit, run, jobs, ingested)
