"""A history read's points kept in the database, so a restarted or second API process brings them up
to date instead of reading every commit again (service/models/kept_history.py).

Revision ID: 5d1b7e9c2a40
Revises: 69ee70a58e31
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "5d1b7e9c2a40"
down_revision = "69ee70a58e31"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "kept_history",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("results_count", sa.BigInteger(), nullable=False),
        sa.Column("results_max_id", sa.BigInteger(), nullable=False),
        sa.Column("last_commit_id", sa.BigInteger(), nullable=False),
        sa.Column("commits_filled", sa.BigInteger(), nullable=False),
        sa.Column("points", sa.LargeBinary(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["project_id"], ["project.id"], name=op.f("fk_kept_history_project_id_project"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_kept_history")),
    )
    with op.batch_alter_table("kept_history", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_kept_history_project_id"), ["project_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("kept_history", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_kept_history_project_id"))
    op.drop_table("kept_history")
