"""The closed vocabularies the tables' CHECK constraints hold, in one place so a test can compare the
constraints the migrations froze with the code (Alembic's compare does not see CHECK text)."""

from __future__ import annotations

from optimizer import LEVEL_NAMES

ENGINES = ("fusionwatch", "onnxruntime")
JOB_STATES = ("queued", "running", "done", "failed")
RUN_STATES = ("running", "done", "failed")
ALERT_KINDS = ("fusion-regression", "fusion-change", "numeric-mismatch", "job-failure", "timing-regression")
# Timing alerts start suspected and become confirmed when a second measurement agrees; others start open.
# A fusion-regression is resolved by the later commit that restores the count; a rise is information.
ALERT_STATES = ("open", "acknowledged", "suspected", "confirmed", "resolved", "info")
# What someone should look at: delivered and not yet acknowledged (a suspected timing alert is not delivered).
NEEDS_ATTENTION = ("open", "confirmed")
HOOK_FORMATS = ("json", "slack")
# An API token's scope: `write` may also read (service/auth.py).
TOKEN_SCOPES = ("read", "write")


def one_of(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN (" + ", ".join(f"'{v}'" for v in values) + ")"


__all__ = ["ALERT_KINDS", "ALERT_STATES", "ENGINES", "HOOK_FORMATS", "JOB_STATES", "LEVEL_NAMES", "NEEDS_ATTENTION", "RUN_STATES", "TOKEN_SCOPES", "one_of"]
