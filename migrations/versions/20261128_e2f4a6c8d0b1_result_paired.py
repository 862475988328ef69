"""result.paired: the baseline and the candidate timed in the same job, alternately, and the paired
decision on them (service/domain/paired.py; measured by the worker, or posted with a result's
"baseline"). result.timing_verdict: the word the timing decision gave the result (regressed, improved,
within noise, inconclusive), the statistic it used and its bar, as the CLI and the pages show them.
Results stored before have neither: they were judged against a window and showed their medians' change.

Revision ID: e2f4a6c8d0b1
Revises: c5e8a1f3b9d6
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "e2f4a6c8d0b1"
down_revision = "c5e8a1f3b9d6"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("result", sa.Column("paired", sa.JSON(), nullable=True))
    op.add_column("result", sa.Column("timing_verdict", sa.JSON(), nullable=True))


def downgrade() -> None:
    # ALTER TABLE … DROP COLUMN, on SQLite too (3.35 and later): a batch copy would drop and recreate the
    # result table, and its rows' history points would go with it (ON DELETE CASCADE).
    op.drop_column("result", "timing_verdict")
    op.drop_column("result", "paired")
