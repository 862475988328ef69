"""Uploaded models as the API shows them."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

from service.schemas.optimizer_run import OptimizerRunPublic


class ModelPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    sha256: str
    size_bytes: int
    opset: int | None
    created_at: datetime


class ModelsPublic(BaseModel):
    data: list[ModelPublic]
    count: int  # all stored models, not just this page


class ModelDetail(ModelPublic):
    # Latest run per level, keyed and ordered by level (disabled … all); levels never run are absent.
    reports: dict[str, OptimizerRunPublic]
