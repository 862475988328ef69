"""An optimizer run as the API shows it: the `fusionwatch optimize --json` report, plus id and time."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict


class RuleStatsPublic(BaseModel):
    fired: int
    ms: float


class NearMissPublic(BaseModel):
    rule: str
    anchor: str
    step: str
    reason: str
    barrier: str | None = None
    message: str


class OptimizerRunPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    level: str
    graph_hash: str
    nodes_before: int
    nodes_after: int
    total_ms: float
    ops_after: dict[str, int]
    fusions: dict[str, int]
    rules: dict[str, RuleStatsPublic]
    near_misses: list[NearMissPublic]
    created_at: datetime
