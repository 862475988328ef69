"""kept_history.points holds each series' points as a reply carries them (usecases/history_points.py:
_packed): the rows kept in the former layout are dropped. They are a cache: the next read of each
reads its points again and stores them anew.

Revision ID: c3f8a2d6e914
Revises: 5d1b7e9c2a40
Create Date: 2026-11-24
"""

from __future__ import annotations

from alembic import op

revision = "c3f8a2d6e914"
down_revision = "5d1b7e9c2a40"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("DELETE FROM kept_history")


def downgrade() -> None:
    op.execute("DELETE FROM kept_history")  # the former code cannot read this layout either
