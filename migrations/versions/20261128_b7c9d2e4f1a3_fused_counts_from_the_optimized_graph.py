"""Fused-op counts are what the optimized graph runs: every result that stored its op histogram
(ops_after) gets its fusions, its result_fusion rows and its history point's counts recounted from
it, so history before and after this change compares alike (optimizer/fused_ops.py). Results
posted without a histogram keep the counts they were posted with.

The fused op keys are written out here, not imported: a migration is a snapshot.

Revision ID: b7c9d2e4f1a3
Revises: b19f0c7e5a26
Create Date: 2026-11-28
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "b7c9d2e4f1a3"
down_revision = "b19f0c7e5a26"
branch_labels = None
depends_on = None

FUSED_OP_KEYS = frozenset({
    "Attention", "Gelu", "Gemm", "LayerNormalization", "RMSNormalization", "RotaryEmbedding",
    "SimplifiedLayerNormalization", "com.fusionwatch.NhwcAveragePool", "com.fusionwatch.NhwcGlobalAveragePool",
    "com.fusionwatch.NhwcMaxPool", "com.microsoft.Attention", "com.microsoft.BiasGelu",
    "com.microsoft.EmbedLayerNormalization", "com.microsoft.FastGelu", "com.microsoft.FusedConv",
    "com.microsoft.FusedGemm", "com.microsoft.FusedMatMul", "com.microsoft.Gelu", "com.microsoft.GroupQueryAttention",
    "com.microsoft.MultiHeadAttention", "com.microsoft.NhwcFusedConv", "com.microsoft.QuickGelu",
    "com.microsoft.RotaryEmbedding", "com.microsoft.SkipLayerNormalization",
    "com.microsoft.SkipSimplifiedLayerNormalization",
})
BATCH = 1000

_result = sa.table("result", sa.column("id"), sa.column("ops_after", sa.JSON), sa.column("fusions", sa.JSON))
_fusion = sa.table("result_fusion", sa.column("result_id"), sa.column("op"), sa.column("count"))
_point = sa.table("history_point", sa.column("result_id"), sa.column("point"), sa.column("version"))


def _fused(ops_after: dict) -> dict:
    return {key: count for key, count in sorted(ops_after.items()) if key in FUSED_OP_KEYS and count > 0}


def upgrade() -> None:
    bind = op.get_bind()
    last = 0
    while True:
        rows = bind.execute(
            sa.select(_result.c.id, _result.c.ops_after, _result.c.fusions)
            .where(_result.c.id > last).order_by(_result.c.id).limit(BATCH)
        ).all()
        if not rows:
            break
        last = rows[-1].id
        for row in rows:
            if not row.ops_after:
                continue
            fusions = _fused(row.ops_after)
            if fusions == (row.fusions or {}):
                continue
            bind.execute(sa.update(_result).where(_result.c.id == row.id).values(fusions=fusions))
            bind.execute(sa.delete(_fusion).where(_fusion.c.result_id == row.id))
            if fusions:
                bind.execute(sa.insert(_fusion), [{"result_id": row.id, "op": key, "count": n} for key, n in fusions.items()])
            point = bind.execute(sa.select(_point.c.point).where(_point.c.result_id == row.id)).scalar()
            if point is not None:
                # A new version, so a process that kept the series' points reads them again.
                if bind.dialect.name == "postgresql":
                    version = sa.text("nextval('history_point_version_seq')")
                else:
                    version = sa.select(sa.func.coalesce(sa.func.max(_point.c.version), 0) + 1).scalar_subquery()
                rendered = json.loads(point) | {"fusions": fusions}
                bind.execute(sa.update(_point).where(_point.c.result_id == row.id)
                             .values(point=json.dumps(rendered, separators=(",", ":")), version=version))


def downgrade() -> None:
    """Counts stay as recounted: the rule-made counts they replace were never stored apart."""
