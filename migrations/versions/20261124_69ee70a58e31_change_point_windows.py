"""Change-point windows kept in the database, so a restarted or second API process reads a series'
history without running every window's permutation tests again (service/models/change_point_window.py).

Revision ID: 69ee70a58e31
Revises: a91c5e3b7d20
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "69ee70a58e31"
down_revision = "a91c5e3b7d20"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "change_point_window",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("engine", sa.String(length=32), nullable=False),
        sa.Column("level", sa.String(length=16), nullable=False),
        sa.Column("machine_class", sa.String(length=32), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("splits", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_id"], ["model.id"], name=op.f("fk_change_point_window_model_id_model"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_change_point_window")),
    )
    with op.batch_alter_table("change_point_window", schema=None) as batch_op:
        batch_op.create_index("ix_change_point_window_series",
                              ["model_id", "engine", "level", "machine_class", "position", "digest"], unique=True)


def downgrade() -> None:
    with op.batch_alter_table("change_point_window", schema=None) as batch_op:
        batch_op.drop_index("ix_change_point_window_series")
    op.drop_table("change_point_window")
