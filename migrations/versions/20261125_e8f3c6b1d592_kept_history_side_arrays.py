"""kept_history.points' header carries each series' commits, p10s and first result beside its seqs
(usecases/history_points.py: _packed), so a restarted process need not parse the rendered points:
the rows kept in the former layout are dropped. They are a cache: the next read of each reads its
points again and stores them anew.

Revision ID: e8f3c6b1d592
Revises: d7e2b5a9c481
Create Date: 2026-11-25
"""

from __future__ import annotations

from alembic import op

revision = "e8f3c6b1d592"
down_revision = "d7e2b5a9c481"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("DELETE FROM kept_history")


def downgrade() -> None:
    op.execute("DELETE FROM kept_history")  # the former code cannot read this layout either
