"""Upload a model: get the optimizer's report at one level or at every level, and keep both.

The model is stored once per distinct file (by sha256); every upload appends one run per level.
All checks and all optimizing happen before the first write, and the writes share one
transaction, so a bad or failing upload leaves the database exactly as it was.
"""

from __future__ import annotations

import logging
from pathlib import PurePath
from typing import Annotated

import onnx
from fastapi import APIRouter, File, Form, HTTPException, UploadFile
from google.protobuf.message import DecodeError

from optimizer import LEVEL_NAMES, ModelLoadError, optimize
from service import crud
from service.api.deps import SessionDep
from service.schemas.optimize import OptimizeResponse
from service.schemas.optimizer_run import OptimizerRunPublic

router = APIRouter(tags=["optimize"])
log = logging.getLogger("fusionwatch.service")

MAX_UPLOAD_BYTES = 2 * 1024**3 - 1  # one protobuf message; larger models need external data
MAX_NAME_CHARS = 255  # the onnx_model.name column


# A plain `def`: optimizing is CPU work and the session is synchronous, so FastAPI runs this in
# its thread pool instead of blocking the event loop.
@router.post("/optimize", response_model=OptimizeResponse)
def create_optimize_report(
    session: SessionDep,
    model: Annotated[UploadFile, File(description="an .onnx file with weights inside")],
    level: Annotated[str | None, Form(description="one level; every level when omitted")] = None,
) -> OptimizeResponse:
    name = PurePath(model.filename or "model.onnx").name
    if len(name) > MAX_NAME_CHARS:
        raise HTTPException(
            422, f"file name {name[:40]!r}… is {len(name)} characters; at most {MAX_NAME_CHARS}"
        )
    if level is not None and level not in LEVEL_NAMES:
        raise HTTPException(422, f"level {level!r} is not one of {', '.join(LEVEL_NAMES)}")
    if model.size is not None and model.size > MAX_UPLOAD_BYTES:
        raise HTTPException(413, f"{name}: {model.size} bytes is over the 2 GiB single-file limit")
    data = model.file.read()
    if len(data) > MAX_UPLOAD_BYTES:
        raise HTTPException(413, f"{name}: {len(data)} bytes is over the 2 GiB single-file limit")
    try:
        proto = onnx.load_from_string(data)
    except DecodeError as error:
        raise HTTPException(422, f"{name}: not an ONNX model ({error})") from error
    if not proto.graph.node:
        raise HTTPException(422, f"{name}: the model's graph has no nodes")
    levels = [level] if level else list(LEVEL_NAMES)
    try:
        reports = [optimize(proto, level=each).report for each in levels]
    except (ModelLoadError, ValueError) as error:
        raise HTTPException(422, f"{name}: {error}") from error

    with session.begin():
        stored, is_new = crud.get_or_create_model(session, name=name, data=data, opset=_default_opset(proto))
        runs = crud.add_runs(session, stored, reports)
    log.info(
        "stored optimizer runs",
        extra={"model_id": stored.id, "model_is_new": is_new, "levels": levels, "sha256": stored.sha256},
    )
    return OptimizeResponse(
        model=name,
        model_id=stored.id,
        model_is_new=is_new,
        levels={run.level: OptimizerRunPublic.model_validate(run) for run in runs},
    )


def _default_opset(proto: onnx.ModelProto) -> int | None:
    return next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
