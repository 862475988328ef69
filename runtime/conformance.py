"""ONNX conformance: ONNX's own backend node cases, run through our InferenceSession.

    python -m runtime.conformance                 # every case we claim; per-op table
    python -m runtime.conformance --op Softmax    # one op (its `_expanded` cases included)
    python -m runtime.conformance --json report.json

ONNX ships a test case for nearly every behaviour of every op (`onnx.backend.test.case.node`):
a small model, input arrays, expected outputs and a tolerance. A case is *claimed* when a
session can be built for it at graph_optimization_level "disabled": every node, in every
subgraph, has a kernel at the model's opset and no kernel declines its node's variant
(UnsupportedModelError). Claimed cases must pass; the rest are listed, per op, as what we do
not run yet. A failure at session creation for any other reason is a claimed case failing.

Cases are grouped by the op they test: a case's single top-level node, or for an
`_expanded` case (the op's function body spelled out as primitive ops) its base case's node.

The case generators are imported inside `collect_cases`: they are a development aid, and
the runtime stays importable without them (they ship with the onnx package regardless).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import re
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from runtime.errors import UnsupportedModelError, domain_label
from runtime.kernels import registry
from runtime.options import SessionOptions
from runtime.session import InferenceSession

TARGET_PASS_RATE = 0.95
# Counted over every case onnx ships, claimed or not (issue 14: 1,500 of onnx 1.23's 1,884), so
# that ops we never claim count against us too.
TARGET_PASSED_OF_ALL = 1500

# Claimed cases that fail for a reason other than a bug, each with its evidence. They still
# count as failures in the pass rate; tests/runtime/test_conformance.py expects them to fail.
KNOWN_DEVIATIONS: dict[str, str] = {
    "test_attention_4d_causal_fp16_expanded": (
        "our Softmax computes float16 in float32; the expected output was computed in float16 "
        "arithmetic. Against a float64 computation ours errs less (3.96e-4 vs 4.91e-4), yet 2 of "
        "192 values are 2 ulp from the expected ones, beyond rtol 1e-3"
    ),
}
NO_OPTIMIZATION = SessionOptions(graph_optimization_level="disabled")
_EXPANDED_SUFFIX = re.compile(r"_expanded(_ver\d+)?$")
_REASON_LENGTH = 240
# Ops no kernel implements, whose `_expanded` cases (primitive ops only) we may still run.
NO_KERNEL_FAMILY = "(expanded only)"


@dataclass(frozen=True, eq=False)  # hashed by identity: the caches key on cases
class Case:
    name: str
    op: tuple[str, str]  # (domain, op_type) of the op the case tests; domain "" for ai.onnx
    model: onnx.ModelProto
    data_sets: tuple[tuple[list[Any], list[Any]], ...]  # (inputs, expected outputs), normalized
    rtol: float
    atol: float

    def __repr__(self) -> str:  # pytest ids and failure headers
        return self.name


@dataclass(frozen=True)
class CaseResult:
    name: str
    op: tuple[str, str]
    claimed: bool
    passed: bool
    reason: str = ""  # why not claimed, or why it failed; "" when it passed


@dataclass
class OpSummary:
    domain: str
    op: str
    family: str  # the kernel module implementing the op, or NO_KERNEL_FAMILY
    cases: int = 0
    claimed: int = 0
    passed: int = 0
    failed: int = 0
    unclaimed_reason: str = ""  # for an op with no claimed case: the first case's reason


@dataclass
class Report:
    results: list[CaseResult]
    ops: list[OpSummary]
    families: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def claimed(self) -> int:
        return sum(result.claimed for result in self.results)

    @property
    def passed(self) -> int:
        return sum(result.passed for result in self.results)

    @property
    def pass_rate(self) -> float:
        return self.passed / self.claimed if self.claimed else 0.0

    @property
    def failures(self) -> list[CaseResult]:
        return [result for result in self.results if result.claimed and not result.passed]

    @property
    def unclaimed_ops(self) -> list[OpSummary]:
        return [summary for summary in self.ops if summary.claimed == 0]

    def as_json(self) -> dict[str, Any]:
        return {
            "cases": len(self.results),
            "claimed": self.claimed,
            "passed": self.passed,
            "failed": self.claimed - self.passed,
            "pass_rate": round(self.pass_rate, 4),
            "target_pass_rate": TARGET_PASS_RATE,
            "target_passed_of_all": TARGET_PASSED_OF_ALL,
            "families": self.families,
            "ops": [dataclasses.asdict(summary) for summary in self.ops if summary.claimed],
            "unclaimed_ops": [
                {"domain": domain_label(s.domain), "op": s.op, "cases": s.cases, "reason": s.unclaimed_reason}
                for s in self.unclaimed_ops
            ],
            "unclaimed_cases": [
                {"case": r.name, "op": _op_label(r.op), "reason": r.reason}
                for r in self.results
                if not r.claimed
            ],
            "failures": [
                {
                    "case": r.name,
                    "op": _op_label(r.op),
                    "reason": r.reason,
                    "known_deviation": KNOWN_DEVIATIONS.get(r.name, ""),
                }
                for r in self.failures
            ],
        }


# --- collecting cases ---------------------------------------------------------------------


@functools.cache
def collect_cases() -> tuple[Case, ...]:
    """Every ONNX backend node case with data, inputs and outputs as numpy values."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generators overflow on purpose (Cast, Reduce* on empty sets)
        raw = [case for case in collect_testcases(None) if case.model is not None and case.data_sets]
    tested_op = {case.name: _top_node_op(case.model) for case in raw}
    return tuple(
        Case(
            name=case.name,
            op=tested_op.get(_EXPANDED_SUFFIX.sub("", case.name)) or tested_op[case.name],
            model=case.model,
            data_sets=tuple(
                ([_normalize(v) for v in inputs], [_normalize(v) for v in outputs])
                for inputs, outputs in case.data_sets
            ),
            rtol=case.rtol,
            atol=case.atol,
        )
        for case in raw
    )


def _top_node_op(model: onnx.ModelProto) -> tuple[str, str] | None:
    nodes = model.graph.node
    if len(nodes) != 1:
        return None
    return (_domain(nodes[0].domain), nodes[0].op_type)


def _domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def _normalize(value: Any) -> Any:
    """Case data as the session takes and returns it: arrays, lists (sequences), None (empty optional)."""
    if value is None:
        return None
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, list | tuple):
        return [_normalize(item) for item in value]
    return np.asarray(value)  # numpy scalars (np.float32(2.0)) become 0-d arrays


def select(cases: Sequence[Case], op: str | None) -> list[Case]:
    """The cases testing `op` ("Softmax", or "com.microsoft.Gelu"); all of them for None."""
    if op is None:
        return list(cases)
    domain, _, op_type = op.rpartition(".")
    return [case for case in cases if case.op[1] == op_type and (not domain or case.op[0] == _domain(domain))]


# --- claiming ---------------------------------------------------------------------------


def _all_nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(attribute.g)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for subgraph in attribute.graphs:
                    yield from _all_nodes(subgraph)


def missing_kernel(model: onnx.ModelProto) -> str | None:
    """The first node (at any depth, function bodies included) without a kernel; a cheap
    screen so that cases we plainly cannot run never build a session."""
    opsets = {_domain(entry.domain): entry.version for entry in model.opset_import}
    nodes = list(_all_nodes(model.graph))
    for function in model.functions:
        nodes.extend(function.node)
    local_functions = {(_domain(f.domain), f.name) for f in model.functions}
    for node in nodes:
        key = (_domain(node.domain), node.op_type)
        if key in local_functions:
            continue  # its body's nodes are checked themselves
        opset = opsets.get(key[0])
        if opset is None:
            return f"{_op_label(key)}: model imports no opset for {domain_label(key[0])}"
        if registry.find_kernel(key[0], key[1], opset) is None:
            return f"no kernel for {_op_label(key)} at opset {opset}"
    return None


@functools.cache
def prepare(case: Case) -> InferenceSession | str | Exception:
    """The case's session (claimed); the reason string (not claimed); or the exception
    that session creation raised for another reason (claimed, and failing)."""
    reason = missing_kernel(case.model)
    if reason is not None:
        return reason
    try:
        return InferenceSession(case.model, NO_OPTIMIZATION)
    except UnsupportedModelError as error:
        return "; ".join(entry.describe() for entry in error.unsupported)
    except Exception as error:  # reported as this case's failure, never hidden
        return error


def is_claimed(case: Case) -> bool:
    return not isinstance(prepare(case), str)


# --- running and comparing --------------------------------------------------------------


@functools.cache
def check(case: Case) -> CaseResult:
    """Run a case on every data set and compare with its own tolerances."""
    prepared = prepare(case)
    if isinstance(prepared, str):
        return CaseResult(case.name, case.op, claimed=False, passed=False, reason=prepared)
    if isinstance(prepared, Exception):
        return CaseResult(case.name, case.op, True, False, f"session creation: {_one_line(prepared)}")
    session = prepared
    feed_names = [arg.name for arg in session.get_inputs()]
    output_names = [arg.name for arg in session.get_outputs()]
    for index, (inputs, expected) in enumerate(case.data_sets):
        where = f"data set {index}: " if len(case.data_sets) > 1 else ""
        feeds = dict(zip(feed_names, inputs, strict=False))
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")  # kernels meet inf/NaN on purpose in edge cases
                actual = session.run(output_names[: len(expected)], feeds)
        except Exception as error:
            return CaseResult(case.name, case.op, True, False, where + _one_line(error))
        for position, (want, got) in enumerate(zip(expected, actual, strict=True)):
            mismatch = compare(want, got, case.rtol, case.atol)
            if mismatch is not None:
                output = output_names[position]
                return CaseResult(case.name, case.op, True, False, f"{where}output '{output}': {mismatch}")
    return CaseResult(case.name, case.op, claimed=True, passed=True)


def compare(expected: Any, actual: Any, rtol: float, atol: float) -> str | None:
    """None when `actual` matches `expected` as ONNX's backend runner judges it; else why not.
    Floats within rtol/atol (NaN equals NaN), bfloat16 at two ULPs as the runner allows, other
    ml_dtypes floats via float32; integers, bools and strings exactly."""
    if expected is None:
        return None if actual is None else f"expected an empty optional, got {_describe(actual)}"
    if isinstance(expected, list):
        if not isinstance(actual, list | tuple):
            return f"expected a sequence of {len(expected)}, got {_describe(actual)}"
        if len(actual) != len(expected):
            return f"sequence length {len(actual)}, expected {len(expected)}"
        for index, (want, got) in enumerate(zip(expected, actual, strict=True)):
            mismatch = compare(want, got, rtol, atol)
            if mismatch is not None:
                return f"sequence item {index}: {mismatch}"
        return None
    if actual is None or isinstance(actual, list | tuple) or not hasattr(actual, "dtype"):
        return f"expected {_describe(expected)}, got {_describe(actual)}"
    actual = np.asarray(actual)
    if actual.shape != expected.shape:
        return f"shape {list(actual.shape)}, expected {list(expected.shape)}"
    if expected.dtype == object or expected.dtype.kind in "US":  # strings
        if actual.dtype != object and actual.dtype.kind not in "US":
            return f"dtype {actual.dtype}, expected strings"
        same = np.array_equal(actual.astype(object), expected.astype(object))
        return None if same else _count_mismatches(actual.astype(object) != expected.astype(object))
    if actual.dtype != expected.dtype:
        return f"dtype {actual.dtype}, expected {expected.dtype}"
    if expected.dtype.kind in "fc" or _is_ml_float(expected.dtype):
        if expected.dtype.name == "bfloat16":
            rtol = max(rtol, 2**-6)
        if expected.dtype.kind not in "fc" or expected.dtype.itemsize < 2:
            actual, expected = actual.astype(np.float32), expected.astype(np.float32)
        close = np.isclose(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
        if close.all():
            return None
        difference = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
        worst = np.unravel_index(np.nanargmax(np.where(close, -np.inf, difference)), difference.shape)
        return (
            f"{_count_mismatches(~close)}; worst at {list(map(int, worst))}: "
            f"got {actual[worst]!r}, expected {expected[worst]!r} (rtol {rtol:g}, atol {atol:g})"
        )
    if expected.dtype.kind not in "biu":  # ml_dtypes' int4/uint4/int2/uint2
        actual, expected = actual.astype(np.int16), expected.astype(np.int16)
    unequal = actual != expected
    if not unequal.any():
        return None
    first = tuple(int(i) for i in np.argwhere(unequal)[0])
    return f"{_count_mismatches(unequal)}; first at {list(first)}: got {actual[first]!r}, expected {expected[first]!r}"


def _is_ml_float(dtype: np.dtype) -> bool:
    # ml_dtypes' float types report kind 'V'; their names say what they are.
    return dtype.kind == "V" and dtype.name.startswith(("bfloat", "float"))


def _count_mismatches(mask: np.ndarray) -> str:
    return f"{int(np.count_nonzero(mask))} of {mask.size} values differ"


def _describe(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, list | tuple):
        return f"a sequence of {len(value)}"
    if hasattr(value, "dtype"):
        return f"{value.dtype}{list(np.shape(value))}"
    return type(value).__name__


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    text = f"{type(error).__name__}: {text}"
    return text if len(text) <= _REASON_LENGTH else text[: _REASON_LENGTH - 1] + "…"


def _op_label(op: tuple[str, str]) -> str:
    return op[1] if op[0] == "" else f"{op[0]}.{op[1]}"


# --- the report -------------------------------------------------------------------------


def _family_of(op: tuple[str, str]) -> str:
    for family in registry.FAMILIES:
        for kernel in family.KERNELS:
            if (_domain(kernel.domain), kernel.op_type) == op:
                return family.__name__.rpartition(".")[2]
    return ""


def run_conformance(op: str | None = None, progress: Callable[[CaseResult], None] | None = None) -> Report:
    results = []
    for case in select(collect_cases(), op):
        result = check(case)
        results.append(result)
        if progress is not None:
            progress(result)
    summaries: dict[tuple[str, str], OpSummary] = {}
    for result in results:
        summary = summaries.get(result.op)
        if summary is None:
            family = _family_of(result.op) or NO_KERNEL_FAMILY
            summary = summaries[result.op] = OpSummary(result.op[0], result.op[1], family)
        summary.cases += 1
        if result.claimed:
            summary.claimed += 1
            summary.passed += result.passed
            summary.failed += not result.passed
        elif not summary.unclaimed_reason:
            summary.unclaimed_reason = result.reason
    ops = sorted(summaries.values(), key=lambda s: (s.family == NO_KERNEL_FAMILY, s.family, s.domain, s.op))
    families: dict[str, dict[str, int]] = {}
    for summary in ops:
        if summary.claimed:
            totals = families.setdefault(summary.family, {"claimed": 0, "passed": 0, "failed": 0})
            totals["claimed"] += summary.claimed
            totals["passed"] += summary.passed
            totals["failed"] += summary.failed
    return Report(results, ops, families)


def format_report(report: Report) -> str:
    lines = [f"{'family':<22} {'op':<34} {'cases':>6} {'claimed':>7} {'passed':>7} {'failed':>7}"]
    for summary in report.ops:
        if summary.claimed:
            lines.append(
                f"{summary.family:<22} {_op_label((summary.domain, summary.op)):<34} {summary.cases:>6} "
                f"{summary.claimed:>7} {summary.passed:>7} {summary.failed:>7}"
            )
    lines.append("")
    lines.append("per family:")
    for family, totals in report.families.items():
        rate = totals["passed"] / totals["claimed"]
        lines.append(f"  {family:<22} {totals['passed']:>5}/{totals['claimed']:<5} {rate:7.1%}")
    lines.append("")
    verdict = "meets" if report.pass_rate >= TARGET_PASS_RATE else "BELOW"
    lines.append(
        f"claimed {report.claimed} of {len(report.results)} cases; passed {report.passed}, "
        f"failed {report.claimed - report.passed}; pass rate {report.pass_rate:.1%} "
        f"({verdict} the {TARGET_PASS_RATE:.0%} target)"
    )
    if len(report.results) == len(collect_cases()):  # the goal counts every case, not one op's
        whole = "meets" if report.passed >= TARGET_PASSED_OF_ALL else "BELOW"
        lines.append(
            f"passed {report.passed} of all {len(report.results)} cases onnx {onnx.__version__} ships "
            f"({whole} the goal of {TARGET_PASSED_OF_ALL})"
        )
    unclaimed = report.unclaimed_ops
    lines.append("")
    lines.append(f"ops with no claimed case ({len(unclaimed)}):")
    for summary in unclaimed:
        label = f"{domain_label(summary.domain)}.{summary.op}"
        lines.append(f"  {label:<40} {summary.cases:>3} case(s): {summary.unclaimed_reason[:100]}")
    failures = report.failures
    lines.append("")
    lines.append(f"failures ({len(failures)}):")
    for result in failures:
        known = " (known deviation, see KNOWN_DEVIATIONS)" if result.name in KNOWN_DEVIATIONS else ""
        lines.append(f"  {result.name} [{_op_label(result.op)}]: {result.reason}{known}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.conformance", description=__doc__.split("\n")[0])
    parser.add_argument("--op", help="only the cases testing this op (Softmax, ai.onnx.ml.LabelEncoder)")
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    args = parser.parse_args(argv)
    report = run_conformance(args.op)
    if not report.results:
        print(f"no ONNX node case tests op {args.op!r}", file=sys.stderr)
        return 2
    print(format_report(report))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(report.as_json(), handle, indent=2)
            handle.write("\n")
    return 0 if report.pass_rate >= TARGET_PASS_RATE else 1


if __name__ == "__main__":
    sys.exit(main())
