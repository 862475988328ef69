"""Reads and writes of the service's tables, for the routes. Callers own the transaction."""

from __future__ import annotations

import hashlib

from sqlalchemy import func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from optimizer import LEVEL_NAMES, OptimizeReport
from service.models import OnnxModel, OptimizerRun

_INSERT_BY_DIALECT = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}


def get_or_create_model(
    session: Session, *, name: str, data: bytes, opset: int | None
) -> tuple[OnnxModel, bool]:
    """The stored model with these bytes, inserting it first if new; and whether it was new.

    INSERT … ON CONFLICT DO NOTHING rather than select-then-insert: two concurrent uploads of the
    same file must both end up with the one row, not one of them with a unique-key error.
    """
    sha256 = hashlib.sha256(data).hexdigest()
    insert = _INSERT_BY_DIALECT[session.get_bind().dialect.name]
    inserted_id = session.execute(
        insert(OnnxModel)
        .values(name=name, sha256=sha256, size_bytes=len(data), opset=opset)
        .on_conflict_do_nothing(index_elements=[OnnxModel.sha256])
        .returning(OnnxModel.id)
    ).scalar_one_or_none()
    model = session.scalars(select(OnnxModel).where(OnnxModel.sha256 == sha256)).one()
    return model, inserted_id is not None


def add_runs(session: Session, model: OnnxModel, reports: list[OptimizeReport]) -> list[OptimizerRun]:
    runs = []
    for report in reports:
        data = report.to_dict()
        runs.append(
            OptimizerRun(
                model_id=model.id,
                level=report.level,
                graph_hash=report.graph_hash,
                nodes_before=report.nodes_before,
                nodes_after=report.nodes_after,
                total_ms=report.total_ms,
                ops_after=data["ops_after"],
                fusions=data["fusions"],
                rules=data["rules"],
                near_misses=data["near_misses"],
            )
        )
    session.add_all(runs)
    session.flush()  # assigns ids and runs the CHECK constraints now, inside the caller's transaction
    return runs


def list_models(session: Session, *, skip: int, limit: int) -> tuple[list[OnnxModel], int]:
    count = session.scalar(select(func.count()).select_from(OnnxModel))
    models = session.scalars(select(OnnxModel).order_by(OnnxModel.id).offset(skip).limit(limit)).all()
    return list(models), count or 0


def get_model(session: Session, model_id: int) -> OnnxModel | None:
    return session.get(OnnxModel, model_id)


def latest_runs(session: Session, model_id: int) -> dict[str, OptimizerRun]:
    """The newest run of each level for a model, in level order (disabled … all).

    Newest is the highest id: ids grow with insertion, while created_at can tie inside one upload.
    """
    newest_ids = (
        select(func.max(OptimizerRun.id))
        .where(OptimizerRun.model_id == model_id)
        .group_by(OptimizerRun.level)
    )
    runs = {
        run.level: run for run in session.scalars(select(OptimizerRun).where(OptimizerRun.id.in_(newest_ids)))
    }
    return {level: runs[level] for level in LEVEL_NAMES if level in runs}
