"""numeric-mismatch alerts name the node: a left-padded decoder batch through an attention fusion that
drops the fully-masked-row guard gives NaN there, and the alert says where and which fusion; with the
real rule there is no alert. Each result records which feed set each check used."""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import select

from service.adapters.engines.feeds import LEFT_PADDED, RIGHT_PADDED, SYNTHESIZED
from service.models import Result
from tests.service.jobs import drain
from tests.service.wrong_fusions import AttentionWithoutGuard, swap_rule

DECODER = Path("tests/models/llama_torchscript_opset14.onnx")
SETTINGS = {"runs": 1, "warmup": 0, "levels": ["extended"], "engines": ["fusionwatch"], "sequence_length": 16}
ATTENTION_OUTPUT = "/model/layers.0/self_attn/Reshape_8_output_0"


def _submit(client, sha: str) -> None:
    assert client.post("/api/v1/projects", json={"name": "p", "settings": SETTINGS}).status_code in (201, 409)
    payload = {"project": "p", "sha": sha, "branch": "main", "parents": []}
    files = [("files", (DECODER.name, DECODER.read_bytes(), "application/octet-stream"))]
    response = client.post("/api/v1/webhooks/ci", data={"payload": json.dumps(payload)}, files=files)
    assert response.status_code == 202, response.text
    assert drain(client) == 1


def _mismatches(client) -> list[dict]:
    return client.get("/api/v1/alerts", params={"project": "p", "kind": "numeric-mismatch"}).json()["items"]


def test_left_padded_nan_from_a_fusion_names_the_attention_node(client, monkeypatch):
    swap_rule(monkeypatch, AttentionWithoutGuard())
    _submit(client, "a0")
    [alert] = _mismatches(client)
    assert (
        f"first divergence at `{ATTENTION_OUTPUT}` (output of com.microsoft.GroupQueryAttention made by "
        "GroupQueryAttentionFusion from what AttentionFusion fused)"
    ) in alert["message"]
    assert "NaN appears there" in alert["message"] and f"(feed set {LEFT_PADDED})" in alert["message"]
    with client.app.state.services.session_factory() as session:
        result = session.scalar(select(Result))
        checks = {check["feed_set"]: check for check in result.numeric_checks}
        assert list(checks) == [SYNTHESIZED, LEFT_PADDED, RIGHT_PADDED]
        assert checks[LEFT_PADDED]["inputs"]["attention_mask"] == "int64[2, 16]"
        assert checks[SYNTHESIZED]["inputs"]["attention_mask"] == "int64[1, 16]"
        assert (checks[SYNTHESIZED]["ok"], checks[LEFT_PADDED]["ok"], checks[RIGHT_PADDED]["ok"]) == (True, False, True)
        assert checks[LEFT_PADDED]["first"] == ATTENTION_OUTPUT
        assert result.divergence["feed_set"] == LEFT_PADDED and result.divergence["first"]["nonfinite"] == "NaN"
        assert not result.numeric_ok
    page = client.get("/projects/p/commits/a0")
    assert page.status_code == 200, page.text
    assert "Numeric check" in page.text and f"feed set {LEFT_PADDED}" in page.text
    assert f"first divergence at `{ATTENTION_OUTPUT}` (output of com.microsoft.GroupQueryAttention" in page.text
    assert f"<code>{ATTENTION_OUTPUT}</code>" in page.text and "GroupQueryAttentionFusion" in page.text


def test_the_real_attention_rule_raises_no_numeric_mismatch(client):
    _submit(client, "b0")
    assert _mismatches(client) == []
    with client.app.state.services.session_factory() as session:
        result = session.scalar(select(Result))
        assert result.numeric_ok
        assert [c["ok"] for c in result.numeric_checks] == [True, True, True]
        assert result.divergence["diverging"] == 0 and result.divergence["rows"]  # the fusions' boundaries


def test_analyze_compare_prints_the_per_node_table_and_checks_the_users_feeds(tmp_path, monkeypatch):
    import numpy as np
    from typer.testing import CliRunner

    from service.cli import app

    mask = np.ones((2, 8), np.int64)
    mask[0, :2] = 0
    feeds = {"input_ids": np.arange(16, dtype=np.int64).reshape(2, 8), "attention_mask": mask,
             "position_ids": np.tile(np.arange(8, dtype=np.int64), (2, 1))}
    np.savez(tmp_path / "mine.npz", **feeds)
    np.savez(tmp_path / "bad.npz", **(feeds | {"attention_mask": mask.astype(np.float32)}))
    args = ["analyze", str(DECODER), "--engine", "fusionwatch", "--level", "extended", "--runs", "1", "--warmup", "0",
            "--sequence-length", "8", "--compare"]
    bad = CliRunner().invoke(app, [*args, "--feeds", f"bad={tmp_path / 'bad.npz'}"])
    assert bad.exit_code == 2
    assert "feed set 'bad': input 'attention_mask' has dtype float32, the model takes int64" in bad.output
    swap_rule(monkeypatch, AttentionWithoutGuard())
    printed = CliRunner().invoke(app, [*args, "--feeds", f"mine={tmp_path / 'mine.npz'}"], env={"COLUMNS": "400"})
    assert printed.exit_code == 0, printed.output
    assert "Numeric check, fusionwatch at extended" in printed.stdout and "mine" in printed.stdout
    assert f"first divergence at `{ATTENTION_OUTPUT}` (output of com.microsoft.GroupQueryAttention made by" in printed.stdout
    assert "from what AttentionFusion fused" in printed.stdout
    assert "Per node, fusionwatch at extended" in printed.stdout and "NaN" in printed.stdout
