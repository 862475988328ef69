"""Liveness: the service answers and knows its optimizer's levels and rules."""

from fastapi import APIRouter

from optimizer import LEVEL_NAMES, known_rule_names

router = APIRouter(tags=["health"])


@router.get("/health")
def read_health() -> dict:
    return {"status": "ok", "levels": list(LEVEL_NAMES), "rules": known_rule_names()}
