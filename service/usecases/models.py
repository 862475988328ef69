"""Ingest an upload: check it as hostile input, store it content-addressed, and file it under a
model name in the project."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import bindparam, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from optimizer import ModelLoadError, check_model_file
from service.adapters.storage import ModelStore, content_digest, safe_filename, unpack_upload
from service.core.limits import UploadLimits
from service.errors import Invalid, NotFound
from service.models import Model, ModelFile, Project


@dataclass
class Ingested:
    model: Model
    file: ModelFile
    file_is_new: bool


def ingest_upload(
    session: Session,
    store: ModelStore,
    limits: UploadLimits,
    project: Project,
    files: list[tuple[str, bytes]],
    name: str | None = None,
) -> Ingested:
    """Check the upload in a scratch directory, then keep it. Nothing is stored if any check fails."""
    model_name, named = unpack_upload(files, limits.max_bytes)
    series = safe_filename(name) if name else model_name
    sha256 = content_digest(model_name, named)
    stored_file = session.scalar(select(ModelFile).where(ModelFile.sha256 == sha256))
    file_is_new = stored_file is None
    if stored_file is None:
        proto = _checked(model_name, named, limits)
        stored = store.put(model_name, named)
        opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
        # Inserts that a concurrent upload of the same file or the same new model name can win (on
        # PostgreSQL: a unique violation): the loser reads the winner's row and goes on in its
        # transaction, instead of failing with a 500 (bench/load.py's uploads met it).
        try:
            with session.begin_nested():
                stored_file = ModelFile(
                    sha256=stored.sha256,
                    filename=stored.filename,
                    size_bytes=max(stored.size_bytes, 1),
                    data_files=list(stored.data_files),
                    opset=opset,
                    nodes=len(proto.graph.node),
                )
                session.add(stored_file)
        except IntegrityError:
            stored_file = session.scalar(select(ModelFile).where(ModelFile.sha256 == sha256))
            file_is_new = False
    named_model = select(Model).where(Model.project_id == project.id, Model.name == series)
    model = session.scalar(named_model)
    if model is None:
        try:
            with session.begin_nested():
                model = Model(project_id=project.id, name=series, latest_file_id=stored_file.id)
                session.add(model)
        except IntegrityError:
            model = session.scalar(named_model)
    model.latest_file_id = stored_file.id
    session.flush()
    return Ingested(model, stored_file, file_is_new)


def _checked(model_name: str, named: dict[str, bytes], limits: UploadLimits):
    """The model's proto after the one loader's checks, run on a scratch copy of the upload."""
    scratch = Path(tempfile.mkdtemp(prefix="fusionwatch-upload-"))
    try:
        for file_name, data in named.items():
            (scratch / file_name).write_bytes(data)
        try:
            proto = check_model_file(scratch / model_name, limits.load)
        except ModelLoadError as error:
            # The message names the scratch path; the user knows the file by its own name.
            raise Invalid(str(error).replace(str(scratch / model_name), model_name)) from error
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if not proto.graph.node:
        raise Invalid(f"{model_name}: the model's graph has no nodes")
    return proto


def get_model(session: Session, project: Project, name: str) -> Model:
    model = session.scalar(select(Model).where(Model.project_id == project.id, Model.name == name))
    if model is None:
        raise NotFound(f"project {project.name!r} has no model {name[:200]!r}")
    return model


_PROJECT_MODELS = select(Model).where(Model.project_id == bindparam("project_id")).order_by(Model.id)


def project_models(session: Session, project: Project) -> list[Model]:
    return list(session.scalars(_PROJECT_MODELS, {"project_id": project.id}))
