"""Our engine: fusionwatch's optimizer at the level, then its SequentialExecutor (runtime/).

Counts come from the optimizer's own report for the session (`session.optimize_result.report`):
the optimized graph's ops, and among them the fused ones (optimizer/fused_ops.py) counted as
onnxruntime's are; timings from the session's profile trace,
written to a temporary folder and gone once read.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Mapping
from importlib.metadata import version as package_version
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

import runtime
from optimizer import optimize
from optimizer.fused_ops import fused_op_counts
from service.adapters.engines.base import failing_as, wall_timer
from service.adapters.engines.custom_ops import NO_CUSTOM_OPS, CustomOps
from service.adapters.engines.feeds import describe_feeds, feeds_digest
from service.adapters.engines.result import EngineResult, read_timings


class FusionwatchEngine:
    name = "fusionwatch"

    def optimized_graph(
        self, model_path: Path, level: str, disabled: tuple[str, ...] = (), custom_ops: CustomOps = NO_CUSTOM_OPS
    ) -> onnx.ModelProto:
        """The graph our session runs for `model_path` at `level`."""
        with failing_as(self.name, level, model_path, "could not optimize"):
            return ir.serde.serialize_model(optimize(model_path, level=level, disabled=disabled).model)

    def version(self) -> str:
        return package_version("fusionwatch")

    def run(
        self,
        model_path: Path,
        level: str,
        feeds: Mapping[str, np.ndarray],
        *,
        runs: int,
        warmup: int,
        threads: int,
        disabled: tuple[str, ...] = (),
        custom_ops: CustomOps = NO_CUSTOM_OPS,
    ) -> EngineResult:
        with tempfile.TemporaryDirectory(prefix="fusionwatch-engine-") as folder:
            options = runtime.SessionOptions(
                graph_optimization_level=level,
                intra_op_num_threads=threads,
                disabled_optimizers=list(disabled),
                enable_profiling=True,
                profile_file_prefix=str(Path(folder) / "fusionwatch_profile"),
            )
            with failing_as(self.name, level, model_path, "could not create a session"):
                started = time.perf_counter()
                session = runtime.InferenceSession(model_path, options, extra_kernels=custom_ops.kernels)
                session_ms = (time.perf_counter() - started) * 1000
            with failing_as(self.name, level, model_path, "failed while running"):
                output_names = [o.name for o in session.get_outputs()]
                for _ in range(warmup + runs):
                    outputs = session.run(None, feeds)
            with failing_as(self.name, level, model_path, "could not read its profile trace"):
                timings = read_timings(session.end_profiling(), warmup)
        report = session.optimize_result.report
        return EngineResult(
            engine=self.name,
            engine_version=self.version(),
            level=level,
            engine_level=level,
            threads=threads,
            runs=timings.runs,
            ops_after=dict(report.ops_after),
            fusions=fused_op_counts(report.ops_after),
            nodes_after=report.nodes_after,
            model_run_ms=timings.model_run_ms,
            execute_ms=timings.execute_ms,
            model_run_samples_ms=timings.model_run_samples_ms,
            execute_samples_ms=timings.execute_samples_ms,
            top_kernels=timings.top_kernels,
            outputs=dict(zip(output_names, outputs, strict=True)),
            peak_bytes=session.peak_bytes,
            kernel_libraries=session.kernel_choices.libraries(),
            session_ms=session_ms,
            inputs=describe_feeds(feeds),
            feeds_digest=feeds_digest(feeds),
            optimizer_report=report,
        )

    def open_timer(
        self,
        model_path: Path,
        level: str,
        feeds: Mapping[str, np.ndarray],
        *,
        threads: int,
        disabled: tuple[str, ...] = (),
        custom_ops: CustomOps = NO_CUSTOM_OPS,
    ) -> Callable[[], float]:
        options = runtime.SessionOptions(
            graph_optimization_level=level, intra_op_num_threads=threads, disabled_optimizers=list(disabled)
        )
        with failing_as(self.name, level, model_path, "could not create a session"):
            session = runtime.InferenceSession(model_path, options, extra_kernels=custom_ops.kernels)
        feeds = dict(feeds)
        return wall_timer(self.name, level, model_path, lambda: session.run(None, feeds))
