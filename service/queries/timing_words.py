"""The timing decision's word for a result as it stands now: the word stored when it was decided
(service/domain/verdict_words.py) and the state its commit's timing alert has reached since."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.domain import verdict_words
from service.domain.vocabulary import AlertKind
from service.models import Alert, Result


def timing_alert_states(session: Session, commit_id: int) -> dict[tuple[int, str, str], str]:
    """(model id, engine, level) → the state of the timing alert raised at this commit."""
    rows = session.execute(select(Alert.model_id, Alert.engine, Alert.level, Alert.state).where(
        Alert.commit_id == commit_id, Alert.kind == AlertKind.TIMING_REGRESSION).order_by(Alert.id))
    return {(model_id, engine, level): state for model_id, engine, level, state in rows}


def timing_word(session: Session, result: Result) -> dict[str, Any] | None:
    state = timing_alert_states(session, result.commit_id).get((result.model_id, result.engine, result.level))
    return verdict_words.shown(result.timing_verdict, state)
