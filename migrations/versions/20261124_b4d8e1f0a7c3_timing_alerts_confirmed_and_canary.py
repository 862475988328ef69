"""Timing alerts are suspected until a second measurement agrees; results carry the job's canary.

Revision ID: b4d8e1f0a7c3
Revises: 7c41e2b9a0d5
Create Date: 2026-11-24

alert.state gains 'suspected' and 'confirmed' (service/usecases/timing_alerts.py); confirmed_result_id
names the measurement that agreed (a re-measurement of the commit, or the next commit) and
confirmed_at when. result.canary_ms is the fixed matrix product each job times (service/adapters/canary.py).
The CHECK list is written out, as in the first migration; tests/service/test_migrations.py compares it
with service/domain/vocabulary.py.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "b4d8e1f0a7c3"
down_revision = "7c41e2b9a0d5"
branch_labels = None
depends_on = None

OLD_STATES = "state IN ('open', 'acknowledged')"
NEW_STATES = "state IN ('open', 'acknowledged', 'suspected', 'confirmed')"


def upgrade() -> None:
    with op.batch_alter_table("result", schema=None) as batch_op:
        batch_op.add_column(sa.Column("canary_ms", sa.Float(), nullable=True))
    with op.batch_alter_table("alert", schema=None) as batch_op:
        batch_op.add_column(sa.Column("confirmed_result_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("confirmed_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.create_foreign_key(
            batch_op.f("fk_alert_confirmed_result_id_result"), "result", ["confirmed_result_id"], ["id"],
            ondelete="SET NULL",
        )
        batch_op.drop_constraint(batch_op.f("ck_alert_state_known"), type_="check")
        batch_op.create_check_constraint("state_known", sa.text(NEW_STATES))


def downgrade() -> None:
    # Suspected and confirmed timing alerts become open ones: the states they had before this revision.
    op.execute("UPDATE alert SET state = 'open' WHERE state IN ('suspected', 'confirmed')")
    with op.batch_alter_table("alert", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("ck_alert_state_known"), type_="check")
        batch_op.create_check_constraint("state_known", sa.text(OLD_STATES))
        batch_op.drop_constraint(batch_op.f("fk_alert_confirmed_result_id_result"), type_="foreignkey")
        batch_op.drop_column("confirmed_at")
        batch_op.drop_column("confirmed_result_id")
    with op.batch_alter_table("result", schema=None) as batch_op:
        batch_op.drop_column("canary_ms")
