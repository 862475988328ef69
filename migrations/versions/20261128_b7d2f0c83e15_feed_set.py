"""feed_set: a project's own .npz inputs for one model, checked by every job of it (service/adapters/feed_sets.py).

Revision ID: b7d2f0c83e15
Revises: a4c9e1f27b30
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "b7d2f0c83e15"
down_revision = "a4c9e1f27b30"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "feed_set",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("inputs", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("length(sha256) = 64", name="feed_set_sha256_is_hex_digest"),
        sa.ForeignKeyConstraint(["model_id"], ["model.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["project_id"], ["project.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("model_id", "name"),
    )
    op.create_index("ix_feed_set_model_id", "feed_set", ["model_id"])


def downgrade() -> None:
    op.drop_index("ix_feed_set_model_id", table_name="feed_set")
    op.drop_table("feed_set")
