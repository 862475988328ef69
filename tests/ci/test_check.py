"""`fusionwatch check`: exit 0 on the expected counts, 1 on a drop with its cause, 2 on a file it cannot
read; `--update` writes what it measured, lists what changed, and the file reads back as written."""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx
from typer.testing import CliRunner

from service.ci import expectations
from service.cli import app
from tests.service.custom_op_plugin import insert_before_gelu

BERT = Path(__file__).resolve().parents[2] / "tests/models/bert_torchscript_opset14.onnx"
runner = CliRunner()


def check(*args: str):
    return runner.invoke(app, ["check", *args], env={"COLUMNS": "200"})


def test_check_passes_on_its_expectations_fails_on_a_drop_with_the_cause_and_update_accepts_it(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    export = models / "bert.onnx"
    shutil.copy(BERT, export)
    expect = tmp_path / "fusionwatch.toml"
    common = ["--expect", str(expect), "--level", "extended", "--level", "basic"]

    created = check(str(export), *common, "--update")
    assert created.exit_code == 0, created.output
    assert "models/bert.onnx fusionwatch extended: added (" in created.output
    written = expectations.read(expect)
    assert written[("models/bert.onnx", "fusionwatch", "extended")]["com.microsoft.BiasGelu"] == 2
    assert written[("models/bert.onnx", "fusionwatch", "extended")]["com.microsoft.Attention"] == 2

    same = check(str(export), *common)
    assert same.exit_code == 0, same.output
    assert "2 model × engine × level checked against" in same.output and "0 drop(s)" in same.output

    onnx.save(insert_before_gelu(onnx.load(BERT)), export)
    dropped = check(str(export), *common)
    assert dropped.exit_code == 1, dropped.output
    (line,) = [line for line in dropped.output.splitlines() if "com.microsoft.BiasGelu 2 → 0" in line]
    assert line.startswith("drop models/bert.onnx fusionwatch extended")
    assert "BiasGeluFusion stopped firing" in line and "its anchor comes from GeluFusion (fired 2)" in line
    assert "comes from ai.onnx.contrib.Passthrough 'custom_0' (custom op, a fusion barrier), not Add" in line

    updated = check(str(export), *common, "--update")
    assert updated.exit_code == 0, updated.output
    assert "models/bert.onnx fusionwatch extended: com.microsoft.BiasGelu 2 → 0" in updated.output
    assert "BiasGelu" not in str(expectations.read(expect)[("models/bert.onnx", "fusionwatch", "extended")])
    assert check(str(export), *common).exit_code == 0


def test_the_file_round_trips_and_a_bad_one_is_named(tmp_path):
    path = tmp_path / "fusionwatch.toml"
    expected = {("models/a \"quoted\".onnx", "fusionwatch", "extended"): {"com.microsoft.BiasGelu": 2, "Reshape": 1},
                ("ünïcode/b.onnx", "onnxruntime", "all"): {},
                ("models/a \"quoted\".onnx", "fusionwatch", "basic"): {"Reshape": 6}}
    expectations.write(path, expected)
    assert expectations.read(path) == expected
    text = path.read_text()
    assert text.index('"basic"]') < text.index('"extended"]')  # levels in their order, not the alphabet's

    path.write_text('["m.onnx".fusionwatch.extended]\n"com.microsoft.BiasGelu" = "two"\n')
    bad = check(str(BERT), "--expect", str(path), "--level", "extended")
    assert bad.exit_code == 2
    assert "[m.onnx.fusionwatch.extended] 'com.microsoft.BiasGelu' must be a count" in bad.output
    assert check(str(tmp_path / "none.onnx"), "--expect", str(path)).exit_code == 2
