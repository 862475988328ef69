"""job.counts: a job's fused-op counts, taken by the worker before any job of its run is timed, so a
run's fusion verdict is known in seconds (service/commands/count_run_fusions.py). Jobs queued before
have none; their run's fusion verdict waits for their results, as every verdict did.

Revision ID: f3b5d7e9a1c4
Revises: e2f4a6c8d0b1
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "f3b5d7e9a1c4"
down_revision = "e2f4a6c8d0b1"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("job", sa.Column("counts", sa.JSON(), nullable=True))


def downgrade() -> None:
    # ALTER TABLE … DROP COLUMN, on SQLite too (3.35 and later): a batch copy would drop and recreate the
    # job table, and its results would lose their job (ON DELETE SET NULL) on the way.
    op.drop_column("job", "counts")
