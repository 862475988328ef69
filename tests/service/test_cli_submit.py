"""Done-when 1, the CLI's half: a model repository's CI runs `fusionwatch submit --wait --fail-on-regression`
for commits A and B of a BERT export against a real `fusionwatch serve`; B's export has a custom op between
the MLP's bias Add and its GELU. The step passes (exit 0) for A and fails (exit 1) for B, printing the
before → after counts and the one alert that names the custom op. Errors exit 2 with the server's reason."""

from __future__ import annotations

import os
import subprocess

import onnx

from tests.service.custom_op_plugin import insert_before_gelu
from tests.service.serving import api_get, api_post, free_port, fusionwatch_command, serving

BERT = "tests/models/bert_torchscript_opset14.onnx"
PLUGIN = "tests.service.custom_op_plugin"
SETTINGS = {"runs": 2, "warmup": 0, "levels": ["disabled", "extended"], "threads": 1, "sequence_length": 16}
# Rich tables wrap at the terminal's width; a CI log has none, so give one wide enough for a row.


def cli_env() -> dict[str, str]:
    # Read at each call: the token serving makes is in os.environ only while it serves.
    return os.environ | {"COLUMNS": "200"}


def submit_export(base: str, sha: str, model, *extra: str) -> subprocess.CompletedProcess:
    args = ["submit", "--server", base, "--project", "bert-exports", "--commit", sha, *extra, str(model)]
    return subprocess.run(fusionwatch_command(*args), env=cli_env(), capture_output=True, text=True, timeout=600)


def two_exports(tmp_path):
    """Commit A's BERT export and commit B's, whose MLP has a custom op between the bias Add and the GELU."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    export_a, export_b = tmp_path / "a" / "bert.onnx", tmp_path / "b" / "bert.onnx"
    onnx.save(onnx.load(BERT), export_a)
    onnx.save(insert_before_gelu(onnx.load(BERT)), export_b)
    return export_a, export_b


def test_submit_fails_the_ci_step_on_the_commit_that_lost_bias_gelu(tmp_path, database_url):
    export_a, export_b = two_exports(tmp_path)
    sha_a, sha_b = "a1" * 20, "b2" * 20
    with serving(tmp_path, database_url, FUSIONWATCH_CUSTOM_OPS=PLUGIN) as (base, _server):
        created = api_post(f"{base}/projects", json={"name": "bert-exports", "settings": SETTINGS})
        assert created.status_code == 201, created.text

        a = submit_export(base, sha_a, export_a, "--wait", "--fail-on-regression", "--message", "export A")
        assert a.returncode == 0, a.stdout + a.stderr
        assert "4 job(s) for bert.onnx" in a.stdout
        assert "verdict: ok (4 of 4 jobs done)" in a.stdout
        assert "BiasGelu 2" in a.stdout and "no alerts" in a.stdout
        assert "measuring: 4 of 4 jobs finished" in a.stderr  # no terminal: progress as log lines

        b = submit_export(base, sha_b, export_b, "--wait", "--fail-on-regression", "--parent", sha_a)
        assert b.returncode == 1, b.stdout + b.stderr
        assert "verdict: regression" in b.stdout
        # The diff against A, for both engines at extended, and the two alerts naming the custom op.
        table_rows = [line for line in b.stdout.splitlines() if line.startswith("│")]
        assert sum("BiasGelu 2 → 0" in row for row in table_rows) == 2
        [alert_line] = [line for line in b.stdout.splitlines() if line.startswith("fusion-regression BiasGeluFusion")]
        assert "ai.onnx.contrib.Passthrough" in alert_line
        assert "(fusionwatch 0.1.0 extended, onnxruntime" in alert_line  # one alert, both engines
        assert "  repro: /api/v1/alerts/" in b.stdout  # under it: its reproduction models

        # Later, or after a --wait-for fusions step: the same table and alerts, for that commit only.
        shown = subprocess.run(fusionwatch_command("show", "--server", base, "--project", "bert-exports", sha_b[:7]),
                               env=cli_env(), capture_output=True, text=True, timeout=120)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert [line for line in shown.stdout.splitlines() if line.startswith("│")] == table_rows
        def alert_lines(out):
            return sorted(line for line in out.splitlines() if line.startswith(("fusion-", "timing-", "numeric-")))

        assert alert_line in alert_lines(shown.stdout) and alert_lines(shown.stdout) == alert_lines(b.stdout)
        assert f"commit page: {base.removesuffix('/api/v1')}/projects/bert-exports/commits/{sha_b}" in shown.stdout
        first = subprocess.run(fusionwatch_command("show", "--server", base, "--project", "bert-exports", sha_a),
                               env=cli_env(), capture_output=True, text=True, timeout=120)
        assert first.returncode == 0 and "no alerts" in first.stdout, first.stdout + first.stderr
        missing = subprocess.run(fusionwatch_command("show", "--server", base, "--project", "bert-exports", "f00ba47"),
                                 env=cli_env(), capture_output=True, text=True, timeout=120)
        assert missing.returncode == 2 and "has no commit 'f00ba47'" in missing.stderr

        # Without --wait the step only sends the commit; a regression does not fail it without the flag.
        again = submit_export(base, "c3" * 20, export_b, "--parent", sha_b)
        assert again.returncode == 0, again.stderr
        assert "verdict" not in again.stdout

        unknown = subprocess.run(
            fusionwatch_command("submit", "--server", base, "--project", "nope", "--commit", "d4", str(export_a)),
            env=cli_env(), capture_output=True, text=True, timeout=120,
        )
        assert unknown.returncode == 2
        assert "HTTP 404: no project named 'nope'" in unknown.stderr


def test_submit_to_an_unreachable_server_exits_2_naming_it(tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(onnx.load(BERT), model)
    server = f"http://127.0.0.1:{free_port()}"
    result = subprocess.run(
        fusionwatch_command("submit", "--server", server, "--project", "p", "--commit", "a1", "--wait", str(model)),
        env=cli_env(), capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    assert f"cannot reach {server}/api/v1/webhooks/ci" in result.stderr


def test_submit_wait_for_fusions_fails_the_step_before_the_timings_are_in(tmp_path, database_url):
    export_a, export_b = two_exports(tmp_path)
    sha_a, sha_b = "a1" * 20, "b2" * 20
    # Enough runs that the timings take seconds after the counts: the step must not wait for them.
    settings = SETTINGS | {"runs": 400}
    with serving(tmp_path, database_url, FUSIONWATCH_CUSTOM_OPS=PLUGIN) as (base, _server):
        created = api_post(f"{base}/projects", json={"name": "bert-exports", "settings": settings})
        assert created.status_code == 201, created.text
        a = submit_export(base, sha_a, export_a, "--wait-for", "fusions", "--fail-on-regression")
        assert a.returncode == 0, a.stdout + a.stderr
        assert "fusion verdict: ok (timings: " in a.stdout

        b = submit_export(base, sha_b, export_b, "--wait-for", "fusions", "--fail-on-regression", "--parent", sha_a)
        assert b.returncode == 1, b.stdout + b.stderr
        assert "fusion verdict: regression (timings: " in b.stdout and "of 4 jobs done" in b.stdout
        rows = [line for line in b.stdout.splitlines() if line.startswith("│") and "BiasGelu" in line]
        assert len(rows) == 2 and all("2 → 0" in row for row in rows)  # both engines at extended
        assert "verdict: regression (" not in b.stdout.replace("fusion verdict: regression (", "")
        [run_line] = [line for line in b.stdout.splitlines() if line.startswith("run ")]
        run = api_get(f"{base}/runs/{run_line.split()[1].rstrip(':')}").json()
        assert run["fusions"]["verdict"] == "regression"


def test_an_export_with_its_data_file_beside_it_is_sent_as_one_zip_the_service_unpacks(tmp_path):
    """The dynamo exporter writes model.onnx and model.onnx.data; the service takes such a model as one
    flat zip, so submit packs the two (and only what the .onnx names), and the series keeps the name."""
    from service.adapters.storage import unpack_upload
    from service.cli_client import upload_of

    model = onnx.load(BERT)
    onnx.save_model(model, tmp_path / "bert.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
                    location="bert.onnx.data", size_threshold=0)
    (tmp_path / "notes.txt").write_text("not named by the model")
    name, handle, kind = upload_of(tmp_path / "bert.onnx")
    with handle:
        sent = handle.read()
    assert (name, kind) == ("bert.zip", "application/zip")
    model_name, files = unpack_upload([(name, sent)], max_bytes=1 << 30)
    assert model_name == "bert.onnx" and sorted(files) == ["bert.onnx", "bert.onnx.data"]
    assert files["bert.onnx.data"] == (tmp_path / "bert.onnx.data").read_bytes()

    # A self-contained export goes as it is; one whose data file is missing too, for the server to name.
    onnx.save_model(model, tmp_path / "whole.onnx")
    (tmp_path / "bert.onnx.data").unlink()
    for path in (tmp_path / "whole.onnx", tmp_path / "bert.onnx"):
        name, handle, kind = upload_of(path)
        handle.close()
        assert (name, kind) == (path.name, "application/octet-stream")
