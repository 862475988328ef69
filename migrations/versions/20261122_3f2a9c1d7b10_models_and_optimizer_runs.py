"""Uploaded models and their optimizer runs.

Revision ID: 3f2a9c1d7b10
Revises:
Create Date: 2026-11-22

The level names are written out, not imported: a migration is a snapshot of the schema on the
day it was written, and must not change when the optimizer's list does (that needs a new one).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "3f2a9c1d7b10"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "onnx_model",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("opset", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("size_bytes > 0", name=op.f("ck_onnx_model_size_bytes_positive")),
        sa.CheckConstraint("length(sha256) = 64", name=op.f("ck_onnx_model_sha256_is_hex_digest")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_onnx_model")),
        sa.UniqueConstraint("sha256", name=op.f("uq_onnx_model_sha256")),
    )
    op.create_table(
        "optimizer_run",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("level", sa.String(length=16), nullable=False),
        sa.Column("graph_hash", sa.String(length=64), nullable=False),
        sa.Column("nodes_before", sa.Integer(), nullable=False),
        sa.Column("nodes_after", sa.Integer(), nullable=False),
        sa.Column("total_ms", sa.Float(), nullable=False),
        sa.Column("ops_after", sa.JSON(), nullable=False),
        sa.Column("fusions", sa.JSON(), nullable=False),
        sa.Column("rules", sa.JSON(), nullable=False),
        sa.Column("near_misses", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "level IN ('disabled', 'basic', 'extended', 'layout', 'all')",
            name=op.f("ck_optimizer_run_level_known"),
        ),
        sa.CheckConstraint("total_ms >= 0", name=op.f("ck_optimizer_run_total_ms_not_negative")),
        sa.CheckConstraint(
            "nodes_before >= 0 AND nodes_after >= 0", name=op.f("ck_optimizer_run_node_counts_not_negative")
        ),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["onnx_model.id"],
            name=op.f("fk_optimizer_run_model_id_onnx_model"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_optimizer_run")),
    )
    op.create_index(
        op.f("ix_optimizer_run_model_id_level_id"), "optimizer_run", ["model_id", "level", "id"], unique=False
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_optimizer_run_model_id_level_id"), table_name="optimizer_run")
    op.drop_table("optimizer_run")
    op.drop_table("onnx_model")
