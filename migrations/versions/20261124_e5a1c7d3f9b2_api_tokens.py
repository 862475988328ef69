"""API tokens: uploads, results and acknowledgements need one; reading does unless configured public.

Revision ID: e5a1c7d3f9b2
Revises: b4d8e1f0a7c3
Create Date: 2026-11-24

Only each token's SHA-256 is stored (service/models/api_token.py); the token itself is shown once,
by `fusionwatch token create`.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "e5a1c7d3f9b2"
down_revision = "b4d8e1f0a7c3"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_token",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("scope IN ('read', 'write')", name=op.f("ck_api_token_scope_known")),
        sa.ForeignKeyConstraint(
            ["project_id"], ["project.id"], name=op.f("fk_api_token_project_id_project"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_token")),
        sa.UniqueConstraint("name", name=op.f("uq_api_token_name")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_api_token_token_hash")),
    )
    with op.batch_alter_table("api_token", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_api_token_project_id"), ["project_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("api_token", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_api_token_project_id"))
    op.drop_table("api_token")
