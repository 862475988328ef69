"""history_point: each series' latest result per commit with the point's JSON a history reply shows,
written as results are stored (service/models/history_point.py), filled here from the results there
are; kept_history, the cache of whole reads it replaces, is dropped.

The point's rendering is written out here, not imported: a migration is a snapshot, and this one
must render as service/usecases/history_points.py: render_point did when it was written.

Revision ID: 14f78e9463e0
Revises: e8f3c6b1d592
Create Date: 2026-11-25
"""

from __future__ import annotations

from datetime import UTC

import orjson
import sqlalchemy as sa
from alembic import op

revision = "14f78e9463e0"
down_revision = "e8f3c6b1d592"
branch_labels = None
depends_on = None

BATCH = 2000

_result = sa.table(
    "result", *(sa.column(name) for name in (
        "id", "project_id", "model_id", "engine", "level", "machine_class", "commit_id", "engine_version",
        "graph_hash", "nodes_after", "median_ms", "p10_ms", "p90_ms", "mad_ms", "numeric_ok")),
    sa.column("fusions", sa.JSON), sa.column("execute_ms", sa.JSON),
)
_commit = sa.table("commit", sa.column("id"), sa.column("sha"), sa.column("branch"), sa.column("message"),
                   sa.column("timestamp", sa.DateTime(timezone=True)), sa.column("seq"))


def _render(row) -> str:
    message, timestamp = row.message, row.timestamp
    if timestamp is not None:  # SQLite keeps UTC without its zone
        timestamp = timestamp.replace(tzinfo=UTC) if timestamp.tzinfo is None else timestamp.astimezone(UTC)
    return orjson.dumps({
        "commit": row.sha, "branch": row.branch,
        "message": message[:201].splitlines()[0][:200] if message else "",
        "timestamp": timestamp.isoformat() if timestamp else None,
        "result_id": row.id, "engine_version": row.engine_version, "graph_hash": row.graph_hash,
        "fusions": row.fusions, "nodes_after": row.nodes_after, "median_ms": row.median_ms, "p10_ms": row.p10_ms,
        "p90_ms": row.p90_ms, "mad_ms": row.mad_ms, "samples": len(row.execute_ms or ()), "numeric_ok": row.numeric_ok,
    }).decode()


def upgrade() -> None:
    history_point = op.create_table(
        "history_point",
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("engine", sa.String(length=32), nullable=False),
        sa.Column("level", sa.String(length=16), nullable=False),
        sa.Column("machine_class", sa.String(length=32), nullable=False),
        sa.Column("commit_id", sa.Integer(), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("commit_seq", sa.Integer(), nullable=False),
        sa.Column("sha", sa.String(length=64), nullable=False),
        sa.Column("result_id", sa.Integer(), nullable=False),
        sa.Column("p10_ms", sa.Float(), nullable=True),
        sa.Column("point", sa.Text(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["commit_id"], ["commit.id"], name=op.f("fk_history_point_commit_id_commit"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["model_id"], ["model.id"], name=op.f("fk_history_point_model_id_model"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["project_id"], ["project.id"], name=op.f("fk_history_point_project_id_project"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["result_id"], ["result.id"], name=op.f("fk_history_point_result_id_result"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("model_id", "engine", "level", "machine_class", "commit_id",
                                name=op.f("pk_history_point")),
    )
    series = (_result.c.model_id, _result.c.engine, _result.c.level, _result.c.machine_class, _result.c.commit_id)
    latest = sa.select(sa.func.max(_result.c.id)).group_by(*series)
    rows = op.get_bind().execute(
        sa.select(_result, _commit.c.sha, _commit.c.branch, _commit.c.message, _commit.c.timestamp, _commit.c.seq)
        .join(_commit, _commit.c.id == _result.c.commit_id).where(_result.c.id.in_(latest)).order_by(_result.c.id)
    ).all()
    for start in range(0, len(rows), BATCH):
        op.bulk_insert(history_point, [{
            "model_id": row.model_id, "engine": row.engine, "level": row.level, "machine_class": row.machine_class,
            "commit_id": row.commit_id, "project_id": row.project_id, "commit_seq": row.seq, "sha": row.sha,
            "result_id": row.id, "p10_ms": row.p10_ms, "point": _render(row), "version": version,
        } for version, row in enumerate(rows[start:start + BATCH], start + 1)])  # fmt: skip
    if op.get_bind().dialect.name == "postgresql":  # history_point.version's source (SQLite counts on)
        op.execute(f"CREATE SEQUENCE history_point_version_seq START WITH {len(rows) + 1}")
    with op.batch_alter_table("history_point", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_history_point_commit_id"), ["commit_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_history_point_result_id"), ["result_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_history_point_version"), ["version"], unique=False)
        batch_op.create_index("ix_history_point_series", ["project_id", "model_id", "engine", "level", "machine_class",
                                                          "commit_seq", "result_id", "version"], unique=False)
    with op.batch_alter_table("kept_history", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_kept_history_project_id"))
    op.drop_table("kept_history")


def downgrade() -> None:
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
        sa.ForeignKeyConstraint(["project_id"], ["project.id"], name=op.f("fk_kept_history_project_id_project"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_kept_history")),
    )
    with op.batch_alter_table("kept_history", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_kept_history_project_id"), ["project_id"], unique=False)
    with op.batch_alter_table("history_point", schema=None) as batch_op:
        batch_op.drop_index("ix_history_point_series")
        batch_op.drop_index(batch_op.f("ix_history_point_version"))
        batch_op.drop_index(batch_op.f("ix_history_point_result_id"))
        batch_op.drop_index(batch_op.f("ix_history_point_commit_id"))
    op.drop_table("history_point")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP SEQUENCE history_point_version_seq")
