"""Tolerances per type (service/domain/tolerances.py): a float16 model whose engines differ by an ulp or
two passes, the same model with a planted error fails naming each output's type and bound; the bound
widens with the square root of the reductions a tensor is computed through; float32 is held to the
project's rtol/atol as before; bfloat16 is compared within its precision, not exactly; integers exactly.
Real engines on tests/models/narrow_block.py."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from pydantic import ValidationError

from service.adapters.engines import run_engine
from service.adapters.engines.precision import narrowest_floats, reduction_depths
from service.adapters.measure import compare_outputs, measure
from service.domain.protocol import Protocol
from service.domain.tolerances import Tolerance, Tolerances
from service.models import Commit, Model, Result
from service.usecases.detect import detect
from tests.models.narrow_block import SEQUENCE, narrow_block

PROTOCOL = Protocol(runs=1, warmup=0, threads=1, sequence_length=SEQUENCE)


def _outputs(engine: str, model: onnx.ModelProto, tmp_path, name: str) -> dict[str, np.ndarray]:
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return run_engine(engine, path, "disabled", runs=1, warmup=0, threads=1, sequence_length=SEQUENCE).outputs


def _narrow() -> dict[str, str]:
    return narrowest_floats(ir.serde.deserialize_graph(narrow_block().graph))


def _depths() -> dict[str, int]:
    return reduction_depths(ir.serde.deserialize_graph(narrow_block().graph))


def test_float16_model_whose_engines_differ_by_an_ulp_passes(tmp_path):
    path = tmp_path / "block.onnx"
    onnx.save(narrow_block(), path)
    # onnxruntime at `disabled` is checked against our engine: the two differ, by more than float32's
    # tolerance (the false alarm this fixes), within float16's.
    measured = measure(path, "onnxruntime", "disabled", PROTOCOL)
    assert measured.numeric_ok, measured.numeric_checks
    assert measured.max_abs_error > 0
    ours, theirs = (_outputs(engine, narrow_block(), tmp_path, engine) for engine in ("fusionwatch", "onnxruntime"))
    assert not np.allclose(ours["logits"].astype(np.float64), theirs["logits"], PROTOCOL.rtol, PROTOCOL.atol)
    for engine in ("fusionwatch", "onnxruntime"):  # and each engine's fusions against its unfused graph
        assert measure(path, engine, "all", PROTOCOL).numeric_ok, engine


def test_a_planted_bias_error_fails_naming_each_outputs_type_and_tolerance(tmp_path):
    ours = _outputs("fusionwatch", narrow_block(), tmp_path, "ours")
    # A bias 3% off: about 4x float16's bound, while the engines' own difference is 0.25x of it.
    found = compare_outputs(
        _outputs("onnxruntime", narrow_block(bias_scale=0.97), tmp_path, "off"), ours, PROTOCOL.tolerances(), _narrow(), _depths()
    )
    assert not found.ok
    logits, _probs, cast_up = found.failed_outputs[:3]
    assert logits.startswith(
        "output 'logits' (float16, 2 reductions deep: atol 1.4e-03 × max|ref| (max|ref| 3.3: 4.5e-03) + rtol 2.8e-03 × |ref|): max abs err 2."
    )
    # float32 computed from float16 is held to float16's bound, and says so
    assert cast_up.startswith("output 'logits_fp32' (float32, computed from float16, 2 reductions deep: atol 1.4e-03 × max|ref|")
    dropped = compare_outputs(
        _outputs("onnxruntime", narrow_block(bias_scale=0.0), tmp_path, "dropped"), ours, PROTOCOL.tolerances(), _narrow(), _depths()
    )
    assert "output 'top': int64 values differ from the unfused int64 ones" in dropped.failed_outputs


def test_the_bound_widens_with_the_square_root_of_the_reductions_a_tensor_is_computed_through():
    # MatMul, then LayerNormalization, then Softmax; the Add, Cast and ArgMax add none
    assert {name: _depths()[name] for name in ("logits", "probs", "logits_fp32", "top")} == {
        "logits": 2, "probs": 3, "logits_fp32": 2, "top": 1,
    }  # fmt: skip
    shallow, deep = (Tolerances().for_dtype("float16", depth) for depth in (1, 100))
    assert (deep.rtol, deep.atol, deep.depth) == (10 * shallow.rtol, 10 * shallow.atol, 100)
    assert Tolerances().for_dtype("float16", 0) == shallow  # an input or a weight: as one reduction
    assert Tolerances().for_dtype("float32", 100) == Tolerances().for_dtype("float32")  # float32 keeps rtol/atol
    # Two engines' difference after 100 reductions (here: 4 u of the tensor's scale) fails at depth 1
    want = np.linspace(-4, 4, 256).astype(np.float16)
    got = (want.astype(np.float64) + 16 * 2**-11 * np.sign(want)).astype(np.float16)
    assert not compare_outputs({"y": got}, {"y": want}, Tolerances()).ok
    assert compare_outputs({"y": got}, {"y": want}, Tolerances(), depths={"y": 100}).ok


def test_float32_keeps_the_projects_tolerance():
    assert Protocol(rtol=1e-2, atol=1e-5).tolerances().for_dtype("float32") == Tolerance("float32", 1e-2, 1e-5)
    rng = np.random.default_rng(3)
    want = rng.standard_normal(1000).astype(np.float32)
    for noise in (1e-5, 1e-4, 1e-3):
        got = want + (noise * rng.standard_normal(1000)).astype(np.float32)
        found = compare_outputs({"y": got}, {"y": want}, Tolerances())
        assert found.ok == np.allclose(got, want, 1e-3, 1e-4), noise
    found = compare_outputs({"y": want + np.float32(1e-2)}, {"y": want}, Tolerances())
    assert found.failed_outputs[0].startswith("output 'y' (float32: atol 1.0e-04 + rtol 1.0e-03 × |ref|): max abs err 1.0e-02")


def test_bfloat16_is_compared_within_its_precision_and_integers_exactly():
    rng = np.random.default_rng(5)
    want = rng.standard_normal(256).astype(ml_dtypes.bfloat16)
    an_ulp_off = (want.view(np.uint16) + 1).view(ml_dtypes.bfloat16)  # was compared exactly: every one failed
    assert compare_outputs({"y": an_ulp_off}, {"y": want}, Tolerances()).ok
    off = compare_outputs({"y": (want.astype(np.float32) * 1.1).astype(ml_dtypes.bfloat16)}, {"y": want}, Tolerances())
    assert not off.ok and off.failed_outputs[0].startswith("output 'y' (bfloat16, 1 reduction deep: atol 7.8e-03 × max|ref|")
    ids = np.arange(8, dtype=np.int64)
    assert not compare_outputs({"ids": ids + (ids == 3)}, {"ids": ids}, Tolerances()).ok


def test_16bit_tolerances_are_project_settings_and_validated(client):
    assert Protocol(rtol_16bit_roundoffs=4).tolerances().for_dtype("float16") == Tolerance(
        "float16", 4 * 2**-11, 2 * 2**-11, scaled=True
    )
    for bad in (-1, 300, float("nan")):
        with pytest.raises(ValidationError):
            Protocol(atol_16bit_roundoffs=bad)
    created = client.post("/api/v1/projects", json={"name": "fp16", "settings": {"rtol_16bit_roundoffs": 16}})
    assert created.status_code == 201, created.text
    settings = client.get("/api/v1/projects/fp16").json()["settings"]
    assert (settings["rtol_16bit_roundoffs"], settings["atol_16bit_roundoffs"]) == (16, 2)
    refused = client.post("/api/v1/projects", json={"name": "fp16b", "settings": {"atol_16bit_roundoffs": -1}})
    assert refused.status_code == 422 and "atol_16bit_roundoffs" in refused.text


def test_the_numeric_alert_names_the_output_its_type_and_bound():
    failed = (
        "output 'logits' (float16, 2 reductions deep: atol 1.4e-03 × max|ref| (max|ref| 3.3: 4.5e-03) + rtol 2.8e-03 × |ref|): "
        "max abs err 2.1e-02, max rel 5.4e+00"
    )
    result = Result(
        engine="onnxruntime", engine_version="1", level="disabled", numeric_ok=False, max_abs_error=2.1e-2,
        max_rel_error=5.4, divergence=None, numeric_checks=[{"feed_set": "synthesized", "ok": False, "failed_outputs": [failed]}],
    )  # fmt: skip
    [alert] = detect(None, result, None, Model(name="block.onnx"), Commit(sha="a1b2c3d4e5f6a7"), None, PROTOCOL)
    assert failed in alert.message and "tolerance rtol" not in alert.message
