"""What a push without files measures: an engine project's registered models; a models project's files at
the pushed commit, fetched from its repository; or nothing, refused with how to configure the project —
never the project's earlier uploads under the new sha (they are another commit's models)."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from service.adapters.model_repository import Repository, RepositoryError, fetch_models
from service.errors import Invalid
from service.models import Project

Uploads = list[tuple[str | None, list[tuple[str, bytes]]]]


def refuse_without_models(project: Project) -> Invalid:
    return Invalid(
        f"project {project.name!r} has no repository and this push sends no model files, so there is nothing of "
        "this commit to measure. Either name the repository: POST /projects {\"name\": ..., \"repository\": "
        "{\"url\": \"https://github.com/ORG/REPO.git\", \"models\": [\"models/*.onnx\"]}}; or send the files with "
        "the push (`fusionwatch submit`, or multipart `files` to /webhooks/ci); or, where the models stay and the "
        "engine changes, create the project with \"kind\": \"engine\"")


def models_at_push(project: Project, sha: str, data_dir: Path, max_bytes: int, allow_file: bool,
                   timeout_s: float) -> Uploads | None:
    """The uploads a push of `sha` measures; None for an engine project (its registered models)."""
    if project.kind == "engine":
        return None
    if project.repository is None:
        raise refuse_without_models(project)
    mirror = data_dir / "repositories" / f"{project.id}.git"
    with _locked(mirror):
        files = fetch_models(Repository(**project.repository), mirror, sha, max_bytes, allow_file, timeout_s)
    names: dict[str, str] = {}
    for path, _ in files:
        name = PurePosixPath(path).name
        if name in names:
            raise RepositoryError(f"{names[name]} and {path} at commit {sha[:12]} would both be model {name!r}; "
                                  "a project's models are named by file name")
        names[name] = path
    return [(None, [(PurePosixPath(path).name, data)]) for path, data in files]


@contextmanager
def _locked(mirror: Path) -> Iterator[None]:
    """One fetch into a mirror at a time, across API processes: git's shallow.lock refuses a second."""
    mirror.parent.mkdir(parents=True, exist_ok=True)
    with open(mirror.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
