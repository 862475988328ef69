"""The reference engine: onnxruntime's CPU provider at the matching GraphOptimizationLevel, ORT_SEQUENTIAL.

The only module of the service that imports onnxruntime. Timings come from onnxruntime's own
profile trace, read as ours is (runtime/profile_table.py). Op counts come from the optimized
model onnxruntime writes (`optimized_model_filepath`), keyed as our optimizer's report keys
them. That file is written by a second session, not the timed one, so its serialization is not
counted in `session_ms`; should onnxruntime fail to write it (it warns that graphs with NCHWc
layout ops are machine-specific, and older releases refused some), the timings still stand and
`graph_error` says why the counts are missing.

Fused ops are counted as for our engine (optimizer/fused_ops.py): the optimized graph's ops that
are products of fusion, whichever transformer, or the exporter, put them there.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from optimizer.fused_ops import fused_op_counts
from optimizer.match import op_key
from runtime.options import ORT_LEVEL_NAMES
from service.adapters.engines.base import EngineError, failing_as, wall_timer
from service.adapters.engines.custom_ops import NO_CUSTOM_OPS, CustomOps
from service.adapters.engines.feeds import describe_feeds, feeds_digest
from service.adapters.engines.result import EngineResult, read_timings

# Our level name -> onnxruntime's GraphOptimizationLevel member, in the same order.
LEVEL_MEMBERS = {ours: member for member, ours in ORT_LEVEL_NAMES.items()}
# onnxruntime releases without ORT_ENABLE_LAYOUT ran their layout transformers (NCHWc) at
# ORT_ENABLE_ALL, the lowest level that had them; that is the level that matches our layout.
LAYOUT_FALLBACK = "ORT_ENABLE_ALL"
OPTIMIZED_MODEL = "optimized.onnx"
# onnxruntime's MatMulAddFusion wraps each Gemm it makes in Reshapes with these names: its helpers, not
# nodes a fusion stands for (compare_onnxruntime.py attributes tensors to the fusions that made them).
HELPER_NAME_PREFIXES = ("gemm_input_reshape", "gemm_output_reshape")


def graph_optimization_level(level: str) -> tuple[str, ort.GraphOptimizationLevel]:
    """onnxruntime's member name and value for our level name."""
    member = LEVEL_MEMBERS[level]
    if not hasattr(ort.GraphOptimizationLevel, member):
        member = LAYOUT_FALLBACK
    return member, getattr(ort.GraphOptimizationLevel, member)


def count_ops(optimized: onnx.ModelProto) -> tuple[dict[str, int], dict[str, int]]:
    """(ops_after, fusions) of onnxruntime's optimized graph, keyed as our report keys them."""
    ops_after = dict(sorted(Counter(op_key(node) for node in optimized.graph.node).items()))
    return ops_after, fused_op_counts(ops_after)


class OnnxruntimeEngine:
    name = "onnxruntime"

    def version(self) -> str:
        return ort.__version__

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
        member, value = graph_optimization_level(level)
        with tempfile.TemporaryDirectory(prefix="fusionwatch-onnxruntime-") as name:
            folder = Path(name)
            options = session_options(value, custom_ops)
            options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
            options.enable_profiling = True
            options.profile_file_prefix = str(folder / "onnxruntime_profile")
            with failing_as(self.name, level, model_path, f"could not create a session at {member}"):
                started = time.perf_counter()
                session = ort.InferenceSession(
                    str(model_path), options, providers=["CPUExecutionProvider"], disabled_optimizers=list(disabled)
                )
                session_ms = (time.perf_counter() - started) * 1000
            with failing_as(self.name, level, model_path, "failed while running"):
                output_names = [o.name for o in session.get_outputs()]
                for _ in range(warmup + runs):
                    outputs = session.run(None, dict(feeds))
            with failing_as(self.name, level, model_path, "could not read its profile trace"):
                timings = read_timings(session.end_profiling(), warmup)
            graph, graph_error = self._optimized_graph(model_path, member, value, folder, disabled, custom_ops)
        if graph is None:
            ops_after, fusions, nodes_after = {}, {}, None
        else:
            ops_after, fusions = count_ops(graph)
            nodes_after = len(graph.graph.node)
        return EngineResult(
            engine=self.name,
            engine_version=self.version(),
            level=level,
            engine_level=member,
            threads=threads,
            runs=timings.runs,
            ops_after=ops_after,
            fusions=fusions,
            nodes_after=nodes_after,
            model_run_ms=timings.model_run_ms,
            execute_ms=timings.execute_ms,
            model_run_samples_ms=timings.model_run_samples_ms,
            execute_samples_ms=timings.execute_samples_ms,
            top_kernels=timings.top_kernels,
            outputs=dict(zip(output_names, outputs, strict=True)),
            session_ms=session_ms,
            inputs=describe_feeds(feeds),
            feeds_digest=feeds_digest(feeds),
            graph_error=graph_error,
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
        member, value = graph_optimization_level(level)
        options = session_options(value, custom_ops)
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        with failing_as(self.name, level, model_path, f"could not create a session at {member}"):
            session = ort.InferenceSession(
                str(model_path), options, providers=["CPUExecutionProvider"], disabled_optimizers=list(disabled)
            )
        feeds = dict(feeds)
        return wall_timer(self.name, level, model_path, lambda: session.run(None, feeds))

    def optimized_graph(
        self, model_path: Path, level: str, disabled: tuple[str, ...] = (), custom_ops: CustomOps = NO_CUSTOM_OPS
    ) -> onnx.ModelProto:
        """The graph onnxruntime runs for `model_path` at `level` (weights left on disk); EngineError if
        it cannot write it."""
        member, value = graph_optimization_level(level)
        with tempfile.TemporaryDirectory(prefix="fusionwatch-onnxruntime-") as name:
            graph, error = self._optimized_graph(model_path, member, value, Path(name), disabled, custom_ops)
        if graph is None:
            raise EngineError(self.name, level, model_path, error)
        return graph

    def _optimized_graph(
        self, model_path: Path, member: str, value: ort.GraphOptimizationLevel, folder: Path, disabled: tuple[str, ...],
        custom_ops: CustomOps,
    ) -> tuple[onnx.ModelProto | None, str | None]:
        """onnxruntime's optimized graph (weights left on disk), or None and the reason it is missing.

        The timed session has already loaded and run this model at this level, so a failure
        here is onnxruntime's writing or our reading of the file, not the model: it is reported
        in the result rather than discarding the timings.
        """
        path = folder / OPTIMIZED_MODEL
        options = session_options(value, custom_ops)
        options.intra_op_num_threads = 1  # this session only writes the graph; it never runs
        options.optimized_model_filepath = str(path)
        # Weights go beside the graph, so models over protobuf's 2 GiB can be written and the
        # graph read back without them.
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", path.name + ".data"
        )
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_min_size_in_bytes", "1024"
        )
        try:
            ort.InferenceSession(
                str(model_path), options, providers=["CPUExecutionProvider"], disabled_optimizers=list(disabled)
            )
            return onnx.load(str(path), load_external_data=False), None
        except Exception as error:
            return None, (
                f"onnxruntime {ort.__version__} could not write its optimized graph at {member} "
                f"({type(error).__name__}: {error}); op counts are unavailable, timings stand"
            )


def session_options(level: ort.GraphOptimizationLevel, custom_ops: CustomOps) -> ort.SessionOptions:
    options = ort.SessionOptions()
    for library in custom_ops.ort_libraries:
        options.register_custom_ops_library(library)
    options.graph_optimization_level = level
    # Errors only: warnings (such as the NCHWc serialization one) would land in the service's
    # stderr beside its JSON logs, and every failure still surfaces as an exception.
    options.log_severity_level = 3
    return options


def optimized_counts(
    model_path: Path, level: str, disabled: tuple[str, ...] = (), custom_ops: CustomOps = NO_CUSTOM_OPS
) -> tuple[dict[str, int], dict[str, int]]:
    """(ops_after, fusions) of onnxruntime at `level`, without timing a run: what `fusionwatch check` compares."""
    return count_ops(OnnxruntimeEngine().optimized_graph(model_path, level, disabled, custom_ops))
