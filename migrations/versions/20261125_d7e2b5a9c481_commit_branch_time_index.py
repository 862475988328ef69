"""An index on a branch's commits by time: (project_id, branch, timestamp, seq).

Revision ID: d7e2b5a9c481
Revises: c3f8a2d6e914
Create Date: 2026-11-25

A result whose commit's parents are not stored yet (results posted at once for consecutive commits)
is compared with the branch's earlier commits by timestamp (usecases/baselines.py), read a page at a
time; without this index each page sorted the branch's commits.
"""

from __future__ import annotations

from alembic import op

revision = "d7e2b5a9c481"
down_revision = "c3f8a2d6e914"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_commit_project_id_branch_timestamp_seq", "commit", ["project_id", "branch", "timestamp", "seq"])


def downgrade() -> None:
    op.drop_index("ix_commit_project_id_branch_timestamp_seq", table_name="commit")
