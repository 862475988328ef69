"""Results say which kernel libraries our engine's session ran on.

Revision ID: a91c5e3b7d20
Revises: 89613762e42c
Create Date: 2026-11-24

result.kernel_libraries is our engine's choice per kernel family ({"gemm": "onednn", "conv":
"onednn", "wait": "spin"}), measured per machine by runtime/kernel_choice.py: when it differs from
the baseline's, a timing alert says so, since the step may be the choice and not the commit.
Existing results get {} (not recorded).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "a91c5e3b7d20"
down_revision = "89613762e42c"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("result", schema=None) as batch_op:
        batch_op.add_column(sa.Column("kernel_libraries", sa.JSON(), nullable=True))
    op.execute("UPDATE result SET kernel_libraries = '{}'")
    with op.batch_alter_table("result", schema=None) as batch_op:
        batch_op.alter_column("kernel_libraries", existing_type=sa.JSON(), nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("result", schema=None) as batch_op:
        batch_op.drop_column("kernel_libraries")
