"""A model is uploaded (the API or the dashboard's form): its files are checked and stored under the
model's name; with a commit named, the commit is submitted with it and its run's jobs are announced
once committed.

Who may upload is the entry point's to say: it hands in `authorize`, called with the project inside
the transaction, which raises to refuse.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from service.adapters import queue
from service.domain.commits import CommitInfo
from service.models import Project
from service.services import Services
from service.usecases.models import Ingested, ingest_upload
from service.usecases.projects import get_project
from service.usecases.submissions import Submission, submit_commit


@dataclass
class Uploaded:
    project: Project
    ingested: Ingested
    submission: Submission | None  # the run it started, when the upload named a commit


def upload_model(
    services: Services, project: str, files: list[tuple[str, bytes]], name: str | None, commit: CommitInfo | None,
    authorize: Callable[[Project], None],
) -> Uploaded:
    """One model's files (an .onnx and its external data, or a .zip of them), filed under `name`
    (default: the file's); measured at `commit` when given."""
    with services.session_factory() as session:
        with session.begin():
            found = get_project(session, project)
            authorize(found)
            if commit is None:
                ingested = ingest_upload(session, services.store, services.upload_limits, found, files, name)
                return Uploaded(found, ingested, None)
            submission = submit_commit(session, services.store, services.upload_limits, found, commit,
                                       [(name, files)], "upload", services.settings.machine_class)
        queue.dispatch(submission.jobs, services.broker_url)
        return Uploaded(found, submission.ingested[0], submission)
