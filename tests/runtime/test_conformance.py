"""ONNX conformance: every ONNX backend node case the runtime claims passes, with the case's
own tolerances; and claimed cases pass at the target rate overall.

Which cases are claimed is decided once per process (runtime.conformance caches the session
it builds for each case, and each case's result), so the per-case tests and the pass-rate
test share one run of every case.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from runtime import conformance

CLAIMED = [case for case in conformance.collect_cases() if conformance.is_claimed(case)]


def _param(case: conformance.Case):
    reason = conformance.KNOWN_DEVIATIONS.get(case.name)
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(case, id=case.name, marks=marks)


@pytest.mark.parametrize("case", [_param(case) for case in CLAIMED])
def test_claimed_case_passes(case):
    result = conformance.check(case)
    assert result.claimed
    assert result.passed, f"{case.name} [{case.op[1]}]: {result.reason}"


def test_claimed_pass_rate_meets_target():
    report = conformance.run_conformance()
    assert report.claimed == len(CLAIMED) > 0
    failures = "\n".join(f"  {r.name}: {r.reason}" for r in report.failures)
    assert report.pass_rate >= conformance.TARGET_PASS_RATE, (
        f"{report.passed}/{report.claimed} claimed cases pass ({report.pass_rate:.1%}); failures:\n{failures}"
    )


def test_passed_cases_of_every_case_onnx_ships_meet_the_goal():
    # Unclaimed cases count here too: an op without a kernel is a gap, not an exclusion.
    report = conformance.run_conformance()
    assert report.passed >= conformance.TARGET_PASSED_OF_ALL, (
        f"{report.passed} of {len(report.results)} cases pass; the goal is {conformance.TARGET_PASSED_OF_ALL}"
    )
    assert "cases onnx" in conformance.format_report(report)


def test_known_deviations_name_claimed_cases():
    """A known deviation whose case is no longer claimed (or renamed) is stale."""
    claimed = {case.name for case in CLAIMED}
    assert set(conformance.KNOWN_DEVIATIONS) <= claimed


def test_expanded_cases_count_toward_the_op_they_expand():
    by_name = {case.name: case for case in conformance.collect_cases()}
    assert by_name["test_softmax_axis_0_expanded"].op == ("", "Softmax")
    assert len(by_name["test_softmax_axis_0_expanded"].model.graph.node) > 1
    assert by_name["test_attention_3d_expanded"].op == ("", "Attention")


def test_compare_judges_as_onnx_backend_runner_does():
    import numpy as np

    compare = conformance.compare
    x = np.array([1.0, np.nan], np.float32)
    assert compare(x, x.copy(), 1e-3, 1e-7) is None  # NaN equals NaN
    assert "1 of 2 values differ" in compare(x, np.array([1.01, np.nan], np.float32), 1e-3, 1e-7)
    assert compare(x, x.astype(np.float64), 1e-3, 1e-7) == "dtype float64, expected float32"
    assert compare(x, x[:1], 1e-3, 1e-7) == "shape [1], expected [2]"
    assert compare([x], [x], 1e-3, 1e-7) is None
    assert compare([x], x, 1e-3, 1e-7).startswith("expected a sequence of 1")
    assert compare(None, None, 1e-3, 1e-7) is None
    assert compare(None, x, 1e-3, 1e-7).startswith("expected an empty optional")
    strings = np.array(["a", "b"], dtype=object)
    assert compare(strings, strings.copy(), 1e-3, 1e-7) is None
    assert compare(strings, np.array(["a", "c"], dtype=object), 1e-3, 1e-7) == "1 of 2 values differ"
    assert compare(np.array([1, 2]), np.array([1, 3]), 1e-3, 1e-7).startswith("1 of 2 values differ")


def test_report_as_json_counts_failures_of_the_selected_op():
    report = conformance.run_conformance("Dropout")
    data = report.as_json()
    assert data["cases"] == len(report.results) > 0 and data["claimed"] == report.claimed
    assert all(op["op"] == "Dropout" for op in data["ops"])
    assert {(f["case"], f["op"]) for f in data["failures"]} == {(r.name, "Dropout") for r in report.failures}
    assert data["passed"] + len(data["failures"]) == data["claimed"]


def test_report_lists_ops_without_kernels_with_the_reason():
    # Training optimizers are outside what an inference runtime implements.
    report = conformance.run_conformance("ai.onnx.preview.training.Adam")
    [summary] = report.unclaimed_ops
    assert (summary.domain, summary.op, summary.claimed) == ("ai.onnx.preview.training", "Adam", 0)
    assert summary.unclaimed_reason.startswith("no kernel for ai.onnx.preview.training.Adam")
    assert report.as_json()["unclaimed_ops"][0]["op"] == "Adam"


def test_runtime_imports_neither_onnxruntime_nor_onnx_reference():
    code = (
        "import sys, runtime, runtime.conformance\n"
        "bad = [m for m in sys.modules if m.startswith(('onnxruntime', 'onnx.reference', 'onnx.backend'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run(
        [sys.executable, "-c", code], check=True, cwd=conformance.__file__.rsplit("/runtime/", 1)[0]
    )
