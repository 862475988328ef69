"""Fusion alerts get a lifecycle and a cause.

alert.state gains 'resolved' (a later commit restored the lost count: resolved_by_commit_id, resolved_at)
and 'info' (a rise: recorded, needing nobody's attention; the open fusion-change alerts there are become
info). Acknowledging records who (acknowledged_by, the token's name) and a note (acknowledged_note).
alert.cause holds why a fusion-regression happened (service/usecases/cause.py).

Revision ID: c5e8a1f3b9d6
Revises: b7c9d2e4f1a3
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "c5e8a1f3b9d6"
down_revision = "b7c9d2e4f1a3"
branch_labels = None
depends_on = None

OLD_STATES = "state IN ('open', 'acknowledged', 'suspected', 'confirmed')"
NEW_STATES = "state IN ('open', 'acknowledged', 'suspected', 'confirmed', 'resolved', 'info')"


def upgrade() -> None:
    with op.batch_alter_table("alert", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cause", sa.JSON(), nullable=False, server_default="{}"))
        batch_op.add_column(sa.Column("acknowledged_by", sa.String(length=100), nullable=True))
        batch_op.add_column(sa.Column("acknowledged_note", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("resolved_by_commit_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.create_foreign_key(
            batch_op.f("fk_alert_resolved_by_commit_id_commit"), "commit", ["resolved_by_commit_id"], ["id"],
            ondelete="SET NULL",
        )
        batch_op.drop_constraint(batch_op.f("ck_alert_state_known"), type_="check")
        batch_op.create_check_constraint("state_known", sa.text(NEW_STATES))
    with op.batch_alter_table("alert", schema=None) as batch_op:
        batch_op.alter_column("cause", server_default=None)
    op.execute("UPDATE alert SET state = 'info' WHERE kind = 'fusion-change' AND state = 'open'")


def downgrade() -> None:
    # Resolved and informational alerts become the open ones they were before this revision.
    op.execute("UPDATE alert SET state = 'open' WHERE state IN ('resolved', 'info')")
    with op.batch_alter_table("alert", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("ck_alert_state_known"), type_="check")
        batch_op.create_check_constraint("state_known", sa.text(OLD_STATES))
        batch_op.drop_constraint(batch_op.f("fk_alert_resolved_by_commit_id_commit"), type_="foreignkey")
        batch_op.drop_column("resolved_at")
        batch_op.drop_column("resolved_by_commit_id")
        batch_op.drop_column("acknowledged_note")
        batch_op.drop_column("acknowledged_by")
        batch_op.drop_column("cause")
