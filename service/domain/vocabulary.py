"""The closed vocabularies the tables' CHECK constraints hold, in one place so a test can compare the
constraints the migrations froze with the code (Alembic's compare does not see CHECK text)."""

from __future__ import annotations

from enum import StrEnum

from optimizer import LEVEL_NAMES

ENGINES = ("fusionwatch", "onnxruntime")
JOB_STATES = ("queued", "running", "done", "failed")
RUN_STATES = ("running", "done", "failed")


class AlertKind(StrEnum):
    """What an alert says happened. A member is its string, so rows, replies and templates hold the value."""

    FUSION_REGRESSION = "fusion-regression"  # fused ops' counts dropped against the baseline
    FUSION_CHANGE = "fusion-change"  # counts rose (information), or a drop a larger fusion absorbed
    NUMERIC_MISMATCH = "numeric-mismatch"  # the level's outputs left the tolerance of level `disabled`
    JOB_FAILURE = "job-failure"  # the model could not be measured
    TIMING_REGRESSION = "timing-regression"  # suspected, then confirmed by a second measurement


ALERT_KINDS = tuple(kind.value for kind in AlertKind)
# Alerts that make a run's verdict "regression" and `fusionwatch submit` fail; fusion-change is information.
REGRESSION_KINDS = (AlertKind.FUSION_REGRESSION, AlertKind.TIMING_REGRESSION, AlertKind.NUMERIC_MISMATCH)
FUSION_KINDS = (AlertKind.FUSION_REGRESSION, AlertKind.FUSION_CHANGE)
# Timing alerts start suspected and become confirmed when a second measurement agrees; others start open.
# A fusion-regression is resolved by the later commit that restores the count; a rise is information.
ALERT_STATES = ("open", "acknowledged", "suspected", "confirmed", "resolved", "info")
# What someone should look at: delivered and not yet acknowledged (a suspected timing alert is not delivered).
NEEDS_ATTENTION = ("open", "confirmed")
# Alert states that fail no verdict: a suspicion still being re-measured, and information (a fusion taken
# up by another, a timing change at level disabled: the export as written, which no user runs).
NOT_FINDINGS = ("suspected", "info")
HOOK_FORMATS = ("json", "slack")
# An API token's scope: `write` may also read (service/auth.py).
TOKEN_SCOPES = ("read", "write")


def one_of(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN (" + ", ".join(f"'{v}'" for v in values) + ")"


__all__ = ["ALERT_KINDS", "FUSION_KINDS", "REGRESSION_KINDS", "AlertKind", "ALERT_STATES", "ENGINES", "HOOK_FORMATS", "JOB_STATES", "LEVEL_NAMES", "NEEDS_ATTENTION", "RUN_STATES", "TOKEN_SCOPES", "one_of"]
