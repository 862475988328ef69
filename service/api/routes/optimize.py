"""Upload a model and get the optimizer's report at one level or at every level."""

from __future__ import annotations

from typing import Annotated

import onnx
from fastapi import APIRouter, File, Form, HTTPException, UploadFile
from google.protobuf.message import DecodeError

from optimizer import LEVEL_NAMES, optimize

router = APIRouter(tags=["optimize"])

MAX_UPLOAD_BYTES = 2 * 1024**3 - 1  # one protobuf message; larger models need external data


@router.post("/optimize")
async def create_optimize_report(
    model: Annotated[UploadFile, File(description="an .onnx file with weights inside")],
    level: Annotated[str | None, Form(description="one level; every level when omitted")] = None,
) -> dict:
    data = await model.read()
    if len(data) > MAX_UPLOAD_BYTES:
        raise HTTPException(413, f"{model.filename}: {len(data)} bytes is over the 2 GiB single-file limit")
    try:
        proto = onnx.load_from_string(data)
    except DecodeError as error:
        raise HTTPException(422, f"{model.filename}: not an ONNX model ({error})") from error
    if not proto.graph.node:
        raise HTTPException(422, f"{model.filename}: the model's graph has no nodes")
    levels = [level] if level else list(LEVEL_NAMES)
    if level is not None and level not in LEVEL_NAMES:
        raise HTTPException(422, f"level {level!r} is not one of {', '.join(LEVEL_NAMES)}")
    reports = {name: optimize(proto, level=name).report.to_dict() for name in levels}
    return {"model": model.filename, "levels": reports}
