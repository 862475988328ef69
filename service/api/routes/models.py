"""Stored models: list them, or read one with its latest optimizer report per level."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query

from service import crud
from service.api.deps import SessionDep
from service.schemas.model import ModelDetail, ModelPublic, ModelsPublic
from service.schemas.optimizer_run import OptimizerRunPublic

router = APIRouter(prefix="/models", tags=["models"])


@router.get("", response_model=ModelsPublic)
def read_models(
    session: SessionDep,
    skip: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> ModelsPublic:
    models, count = crud.list_models(session, skip=skip, limit=limit)
    return ModelsPublic(data=[ModelPublic.model_validate(m) for m in models], count=count)


@router.get("/{model_id}", response_model=ModelDetail)
def read_model(session: SessionDep, model_id: int) -> ModelDetail:
    model = crud.get_model(session, model_id)
    if model is None:
        raise HTTPException(404, f"no model with id {model_id}; GET /api/v1/models lists the stored ones")
    reports = {
        level: OptimizerRunPublic.model_validate(run)
        for level, run in crud.latest_runs(session, model_id).items()
    }
    return ModelDetail(**ModelPublic.model_validate(model).model_dump(), reports=reports)
