"""Projects, models, commits, runs, jobs, results, alerts and hooks; the one-off upload tables go.

Revision ID: 7c41e2b9a0d5
Revises: 3f2a9c1d7b10
Create Date: 2026-11-24

onnx_model/optimizer_run held one report per upload, with no commit, machine or model bytes, so
no baseline can be built on them and no worker can re-run them; they are replaced, not carried over.
The CHECK lists are written out (a migration is a snapshot); tests/service/test_migrations.py
compares them with service/domain/vocabulary.py, which Alembic's compare cannot do.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "7c41e2b9a0d5"
down_revision = "3f2a9c1d7b10"
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "machine",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("machine_class", sa.String(length=32), nullable=False),
        sa.Column("hostname", sa.String(length=255), nullable=False),
        sa.Column("cpu", sa.String(length=255), nullable=False),
        sa.Column("cores", sa.Integer(), nullable=False),
        sa.Column("isa", sa.JSON(), nullable=False),
        sa.Column("gpu", sa.String(length=255), nullable=False),
        sa.Column("engine_versions", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_machine")),
        sa.UniqueConstraint("fingerprint", name=op.f("uq_machine_fingerprint")),
    )
    op.create_table(
        "model_file",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("filename", sa.String(length=255), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("data_files", sa.JSON(), nullable=False),
        sa.Column("opset", sa.Integer(), nullable=True),
        sa.Column("nodes", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("length(sha256) = 64", name=op.f("ck_model_file_sha256_is_hex_digest")),
        sa.CheckConstraint("size_bytes > 0", name=op.f("ck_model_file_size_bytes_positive")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_file")),
        sa.UniqueConstraint("sha256", name=op.f("uq_model_file_sha256")),
    )
    op.create_table(
        "project",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("webhook_secret", sa.String(length=200), nullable=True),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_project")),
        sa.UniqueConstraint("name", name=op.f("uq_project_name")),
    )
    op.create_table(
        "commit",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("sha", sa.String(length=64), nullable=False),
        sa.Column("branch", sa.String(length=255), nullable=False),
        sa.Column("parents", sa.JSON(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("author", sa.String(length=255), nullable=False),
        sa.Column("timestamp", sa.DateTime(timezone=True), nullable=True),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["project_id"], ["project.id"], name=op.f("fk_commit_project_id_project"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_commit")),
        sa.UniqueConstraint("project_id", "sha", name=op.f("uq_commit_project_id_sha")),
    )
    with op.batch_alter_table("commit", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_commit_project_id_branch_seq"), ["project_id", "branch", "seq"], unique=False
        )

    op.create_table(
        "hook",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("url", sa.String(length=2000), nullable=False),
        sa.Column("format", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("format IN ('json', 'slack')", name=op.f("ck_hook_format_known")),
        sa.ForeignKeyConstraint(
            ["project_id"], ["project.id"], name=op.f("fk_hook_project_id_project"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_hook")),
    )
    with op.batch_alter_table("hook", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_hook_project_id"), ["project_id"], unique=False)

    op.create_table(
        "model",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("latest_file_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["latest_file_id"], ["model_file.id"], name=op.f("fk_model_latest_file_id_model_file")
        ),
        sa.ForeignKeyConstraint(
            ["project_id"], ["project.id"], name=op.f("fk_model_project_id_project"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model")),
        sa.UniqueConstraint("project_id", "name", name=op.f("uq_model_project_id_name")),
    )
    op.create_table(
        "run",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("commit_id", sa.Integer(), nullable=False),
        sa.Column("trigger", sa.String(length=32), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("state IN ('running', 'done', 'failed')", name=op.f("ck_run_state_known")),
        sa.ForeignKeyConstraint(
            ["commit_id"], ["commit.id"], name=op.f("fk_run_commit_id_commit"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["project_id"], ["project.id"], name=op.f("fk_run_project_id_project"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run")),
    )
    with op.batch_alter_table("run", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_run_commit_id"), ["commit_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_run_project_id"), ["project_id"], unique=False)

    op.create_table(
        "job",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("model_file_id", sa.Integer(), nullable=False),
        sa.Column("engine", sa.String(length=32), nullable=False),
        sa.Column("level", sa.String(length=16), nullable=False),
        sa.Column("machine_class", sa.String(length=32), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(length=200), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("engine IN ('fusionwatch', 'onnxruntime')", name=op.f("ck_job_engine_known")),
        sa.CheckConstraint(
            "level IN ('disabled', 'basic', 'extended', 'layout', 'all')", name=op.f("ck_job_level_known")
        ),
        sa.CheckConstraint(
            "state IN ('queued', 'running', 'done', 'failed')", name=op.f("ck_job_state_known")
        ),
        sa.CheckConstraint("attempts >= 0", name=op.f("ck_job_attempts_not_negative")),
        sa.ForeignKeyConstraint(
            ["model_file_id"], ["model_file.id"], name=op.f("fk_job_model_file_id_model_file")
        ),
        sa.ForeignKeyConstraint(
            ["model_id"], ["model.id"], name=op.f("fk_job_model_id_model"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"], name=op.f("fk_job_run_id_run"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job")),
        sa.UniqueConstraint(
            "run_id", "model_id", "engine", "level", name=op.f("uq_job_run_id_model_id_engine_level")
        ),
    )
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_job_run_id"), ["run_id"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_job_state_machine_class_id"), ["state", "machine_class", "id"], unique=False
        )

    op.create_table(
        "webhook_delivery",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("delivery_id", sa.String(length=100), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("event", sa.String(length=50), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["project.id"],
            name=op.f("fk_webhook_delivery_project_id_project"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["run.id"], name=op.f("fk_webhook_delivery_run_id_run"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_delivery")),
        sa.UniqueConstraint("delivery_id", name=op.f("uq_webhook_delivery_delivery_id")),
    )
    op.create_table(
        "result",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("commit_id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("model_file_id", sa.Integer(), nullable=True),
        sa.Column("machine_id", sa.Integer(), nullable=True),
        sa.Column("engine", sa.String(length=32), nullable=False),
        sa.Column("engine_version", sa.String(length=64), nullable=False),
        sa.Column("level", sa.String(length=16), nullable=False),
        sa.Column("machine_class", sa.String(length=32), nullable=False),
        sa.Column("threads", sa.Integer(), nullable=False),
        sa.Column("inputs", sa.JSON(), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("nodes_before", sa.Integer(), nullable=True),
        sa.Column("nodes_after", sa.Integer(), nullable=True),
        sa.Column("ops_after", sa.JSON(), nullable=False),
        sa.Column("fusions", sa.JSON(), nullable=False),
        sa.Column("rules", sa.JSON(), nullable=False),
        sa.Column("near_misses", sa.JSON(), nullable=False),
        sa.Column("graph_hash", sa.String(length=64), nullable=True),
        sa.Column("execute_ms", sa.JSON(), nullable=False),
        sa.Column("model_run_ms", sa.JSON(), nullable=False),
        sa.Column("median_ms", sa.Float(), nullable=True),
        sa.Column("p10_ms", sa.Float(), nullable=True),
        sa.Column("p90_ms", sa.Float(), nullable=True),
        sa.Column("mad_ms", sa.Float(), nullable=True),
        sa.Column("top_kernels", sa.JSON(), nullable=False),
        sa.Column("max_abs_error", sa.Float(), nullable=True),
        sa.Column("max_rel_error", sa.Float(), nullable=True),
        sa.Column("numeric_ok", sa.Boolean(), nullable=True),
        sa.Column("peak_bytes", sa.BigInteger(), nullable=True),
        sa.Column("session_ms", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("engine IN ('fusionwatch', 'onnxruntime')", name=op.f("ck_result_engine_known")),
        sa.CheckConstraint(
            "level IN ('disabled', 'basic', 'extended', 'layout', 'all')", name=op.f("ck_result_level_known")
        ),
        sa.CheckConstraint("median_ms IS NULL OR median_ms >= 0", name=op.f("ck_result_median_not_negative")),
        sa.CheckConstraint(
            "p10_ms IS NULL OR p90_ms IS NULL OR p10_ms <= p90_ms", name=op.f("ck_result_percentiles_ordered")
        ),
        sa.ForeignKeyConstraint(
            ["commit_id"], ["commit.id"], name=op.f("fk_result_commit_id_commit"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["job.id"], name=op.f("fk_result_job_id_job"), ondelete="SET NULL"
        ),
        sa.ForeignKeyConstraint(["machine_id"], ["machine.id"], name=op.f("fk_result_machine_id_machine")),
        sa.ForeignKeyConstraint(
            ["model_file_id"], ["model_file.id"], name=op.f("fk_result_model_file_id_model_file")
        ),
        sa.ForeignKeyConstraint(
            ["model_id"], ["model.id"], name=op.f("fk_result_model_id_model"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["project_id"], ["project.id"], name=op.f("fk_result_project_id_project"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["run.id"], name=op.f("fk_result_run_id_run"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_result")),
        sa.UniqueConstraint("job_id", name=op.f("uq_result_job_id")),
    )
    with op.batch_alter_table("result", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_result_commit_id"), ["commit_id"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_result_fingerprint_commit_id"), ["fingerprint", "commit_id"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_result_run_id"), ["run_id"], unique=False)

    op.create_table(
        "alert",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=True),
        sa.Column("engine", sa.String(length=32), nullable=True),
        sa.Column("level", sa.String(length=16), nullable=True),
        sa.Column("commit_id", sa.Integer(), nullable=True),
        sa.Column("baseline_commit_id", sa.Integer(), nullable=True),
        sa.Column("result_id", sa.Integer(), nullable=True),
        sa.Column("baseline_result_id", sa.Integer(), nullable=True),
        sa.Column("op", sa.String(length=300), nullable=True),
        sa.Column("rule", sa.String(length=100), nullable=True),
        sa.Column("before", sa.Float(), nullable=True),
        sa.Column("after", sa.Float(), nullable=True),
        sa.Column("change_pct", sa.Float(), nullable=True),
        sa.Column("changes", sa.JSON(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("near_misses", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("acknowledged_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "kind IN ('fusion-regression', 'fusion-change', 'numeric-mismatch', 'job-failure', 'timing-regression')",
            name=op.f("ck_alert_kind_known"),
        ),
        sa.CheckConstraint("state IN ('open', 'acknowledged')", name=op.f("ck_alert_state_known")),
        sa.ForeignKeyConstraint(
            ["baseline_commit_id"],
            ["commit.id"],
            name=op.f("fk_alert_baseline_commit_id_commit"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["baseline_result_id"],
            ["result.id"],
            name=op.f("fk_alert_baseline_result_id_result"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["commit_id"], ["commit.id"], name=op.f("fk_alert_commit_id_commit"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["model_id"], ["model.id"], name=op.f("fk_alert_model_id_model"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["project_id"], ["project.id"], name=op.f("fk_alert_project_id_project"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["result_id"], ["result.id"], name=op.f("fk_alert_result_id_result"), ondelete="SET NULL"
        ),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"], name=op.f("fk_alert_run_id_run"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert")),
    )
    with op.batch_alter_table("alert", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_alert_project_id_kind_state_id"),
            ["project_id", "kind", "state", "id"],
            unique=False,
        )
        batch_op.create_index(batch_op.f("ix_alert_run_id"), ["run_id"], unique=False)

    op.create_table(
        "result_fusion",
        sa.Column("result_id", sa.Integer(), nullable=False),
        sa.Column("op", sa.String(length=300), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.CheckConstraint("count >= 0", name=op.f("ck_result_fusion_count_not_negative")),
        sa.ForeignKeyConstraint(
            ["result_id"], ["result.id"], name=op.f("fk_result_fusion_result_id_result"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("result_id", "op", name=op.f("pk_result_fusion")),
    )
    with op.batch_alter_table("result_fusion", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_result_fusion_op_result_id"), ["op", "result_id"], unique=False)

    op.create_table(
        "alert_delivery",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("alert_id", sa.Integer(), nullable=False),
        sa.Column("hook_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["alert_id"], ["alert.id"], name=op.f("fk_alert_delivery_alert_id_alert"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["hook_id"], ["hook.id"], name=op.f("fk_alert_delivery_hook_id_hook"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_delivery")),
    )
    with op.batch_alter_table("alert_delivery", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_alert_delivery_alert_id"), ["alert_id"], unique=False)

    with op.batch_alter_table("optimizer_run", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_optimizer_run_model_id_level_id"))

    op.drop_table("optimizer_run")
    op.drop_table("onnx_model")


def downgrade() -> None:

    op.create_table(
        "onnx_model",
        sa.Column("id", sa.INTEGER(), nullable=False),
        sa.Column("name", sa.VARCHAR(length=255), nullable=False),
        sa.Column("sha256", sa.VARCHAR(length=64), nullable=False),
        sa.Column("size_bytes", sa.BIGINT(), nullable=False),
        sa.Column("opset", sa.INTEGER(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("length(sha256) = 64", name=op.f("ck_onnx_model_sha256_is_hex_digest")),
        sa.CheckConstraint("size_bytes > 0", name=op.f("ck_onnx_model_size_bytes_positive")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_onnx_model")),
        sa.UniqueConstraint("sha256", name=op.f("uq_onnx_model_sha256")),
    )
    op.create_table(
        "optimizer_run",
        sa.Column("id", sa.INTEGER(), nullable=False),
        sa.Column("model_id", sa.INTEGER(), nullable=False),
        sa.Column("level", sa.VARCHAR(length=16), nullable=False),
        sa.Column("graph_hash", sa.VARCHAR(length=64), nullable=False),
        sa.Column("nodes_before", sa.INTEGER(), nullable=False),
        sa.Column("nodes_after", sa.INTEGER(), nullable=False),
        sa.Column("total_ms", sa.FLOAT(), nullable=False),
        sa.Column("ops_after", sa.JSON(), nullable=False),
        sa.Column("fusions", sa.JSON(), nullable=False),
        sa.Column("rules", sa.JSON(), nullable=False),
        sa.Column("near_misses", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "level IN ('disabled', 'basic', 'extended', 'layout', 'all')",
            name=op.f("ck_optimizer_run_level_known"),
        ),
        sa.CheckConstraint(
            "nodes_before >= 0 AND nodes_after >= 0", name=op.f("ck_optimizer_run_node_counts_not_negative")
        ),
        sa.CheckConstraint("total_ms >= 0", name=op.f("ck_optimizer_run_total_ms_not_negative")),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["onnx_model.id"],
            name=op.f("fk_optimizer_run_model_id_onnx_model"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_optimizer_run")),
    )
    with op.batch_alter_table("optimizer_run", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_optimizer_run_model_id_level_id"), ["model_id", "level", "id"], unique=False
        )

    with op.batch_alter_table("alert_delivery", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_alert_delivery_alert_id"))

    op.drop_table("alert_delivery")
    with op.batch_alter_table("result_fusion", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_result_fusion_op_result_id"))

    op.drop_table("result_fusion")
    with op.batch_alter_table("alert", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_alert_run_id"))
        batch_op.drop_index(batch_op.f("ix_alert_project_id_kind_state_id"))

    op.drop_table("alert")
    with op.batch_alter_table("result", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_result_run_id"))
        batch_op.drop_index(batch_op.f("ix_result_fingerprint_commit_id"))
        batch_op.drop_index(batch_op.f("ix_result_commit_id"))

    op.drop_table("result")
    op.drop_table("webhook_delivery")
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_state_machine_class_id"))
        batch_op.drop_index(batch_op.f("ix_job_run_id"))

    op.drop_table("job")
    with op.batch_alter_table("run", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_run_project_id"))
        batch_op.drop_index(batch_op.f("ix_run_commit_id"))

    op.drop_table("run")
    op.drop_table("model")
    with op.batch_alter_table("hook", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_hook_project_id"))

    op.drop_table("hook")
    with op.batch_alter_table("commit", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_commit_project_id_branch_seq"))

    op.drop_table("commit")
    op.drop_table("project")
    op.drop_table("model_file")
    op.drop_table("machine")
