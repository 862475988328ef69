"""A project's kind ("models" or "engine") and its model repository (url, model paths, credentials name).

Revision ID: b19f0c7e5a26
Revises: b7d2f0c83e15
Create Date: 2026-11-28

A push without files measured the project's earlier uploads under the new sha. Now a "models" project's
push brings its files or has them fetched from the repository, and only an "engine" project measures its
registered models again. Existing projects become "models": their next push without files is refused
with the way to configure it, rather than measured against the wrong file.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "b19f0c7e5a26"
down_revision = "b7d2f0c83e15"
branch_labels = None
depends_on = None


# Plain ALTER TABLE, not a batch: SQLite's batch copies and drops the table, and dropping `project` with
# foreign keys on deletes every row that references it.
def upgrade() -> None:
    op.add_column("project", sa.Column("kind", sa.String(20), nullable=False, server_default="models"))
    op.add_column("project", sa.Column("repository", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("project", "repository")
    op.drop_column("project", "kind")
