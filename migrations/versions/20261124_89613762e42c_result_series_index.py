"""An index for reading a series' history: results by project, model, engine, level, machine class, commit.

Revision ID: 89613762e42c
Revises: e5a1c7d3f9b2
Create Date: 2026-11-24

`GET /projects/{p}/history` and the dashboard's model page read one model's results (one series when
engine and level are given) and pick the latest result per commit; without this index both scanned
every result of every project, timing samples included, and the picking covers the index alone.
"""

from __future__ import annotations

from alembic import op

revision = "89613762e42c"
down_revision = "e5a1c7d3f9b2"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_result_series", "result", ["project_id", "model_id", "engine", "level", "machine_class", "commit_id"]
    )


def downgrade() -> None:
    op.drop_index("ix_result_series", table_name="result")
