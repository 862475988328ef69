"""result.numeric_checks and result.divergence: the mark-all numeric check per feed set, and the worst
comparison's first diverging tensor and per-node rows (service/adapters/engines/numerics.py). Results stored
before have neither: they were checked on their graph outputs only.

Revision ID: a4c9e1f27b30
Revises: 14f78e9463e0
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "a4c9e1f27b30"
down_revision = "14f78e9463e0"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("result", sa.Column("numeric_checks", sa.JSON(), nullable=True))
    op.add_column("result", sa.Column("divergence", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("result") as batch:
        batch.drop_column("divergence")
        batch.drop_column("numeric_checks")
