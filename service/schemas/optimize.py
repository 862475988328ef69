"""What POST /api/v1/optimize answers."""

from __future__ import annotations

from pydantic import BaseModel

from service.schemas.optimizer_run import OptimizerRunPublic


class OptimizeResponse(BaseModel):
    model: str  # the uploaded file's name
    model_id: int
    model_is_new: bool  # False when these bytes were uploaded before (the stored model is reused)
    levels: dict[str, OptimizerRunPublic]
