"""The baseline side of a paired measurement run in another Python environment: an engine's own commits.

For an engine's commits (onnxruntime 1.19.2 against 1.20.1, say) the baseline is not a file but an
installation, so `fusionwatch run --baseline-python PATH` starts PATH on a small script (BASELINE_TIMER,
which needs only numpy and the engine in that environment), hands it the model, level, threads and
the feeds as an .npz, and asks it for blocks over a pipe: one line "k" in, one line out, the fastest of
k runs in ms. This process times the candidate side itself, so the two alternate block by block
(paired_measure.alternate) on the same feeds and the same clock.
"""

from __future__ import annotations

import json
import select
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from service.adapters.engines import EngineError
from service.adapters.engines.onnxruntime import LAYOUT_FALLBACK, LEVEL_MEMBERS

START_TIMEOUT_S = 300.0  # opening a large model in the baseline environment, optimizer included
BLOCK_TIMEOUT_S = 600.0

BASELINE_TIMER = r"""
import json, sys, time
import numpy as np
args = json.loads(sys.argv[1])
feeds = dict(np.load(args["feeds"]))
if args["engine"] == "onnxruntime":
    import onnxruntime as ort
    options = ort.SessionOptions()
    member = args["member"] if hasattr(ort.GraphOptimizationLevel, args["member"]) else args["fallback"]
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, member)
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.intra_op_num_threads = args["threads"]
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(args["model"], options, providers=["CPUExecutionProvider"])
    version = ort.__version__
else:
    import runtime
    from importlib.metadata import version as package_version
    options = runtime.SessionOptions(graph_optimization_level=args["level"], intra_op_num_threads=args["threads"])
    session = runtime.InferenceSession(args["model"], options)
    version = package_version("fusionwatch")
print(json.dumps({"version": version}), flush=True)
for line in sys.stdin:
    best = float("inf")
    for _ in range(int(line)):
        started = time.perf_counter()
        session.run(None, feeds)
        best = min(best, (time.perf_counter() - started) * 1000)
    print(repr(best), flush=True)
"""


class BaselineProcess:
    """A session open in another Python environment; `block(k)` times k runs there."""

    def __init__(self, python: Path, engine: str, model: Path, level: str, threads: int,
                 feeds: Mapping[str, np.ndarray]) -> None:
        self.engine, self.level, self.model = engine, level, model
        self._folder = tempfile.TemporaryDirectory(prefix="fusionwatch-baseline-")
        feeds_path = Path(self._folder.name) / "feeds.npz"
        np.savez(feeds_path, **{name: np.asarray(value) for name, value in feeds.items()})
        args = {"engine": engine, "model": str(model), "level": level, "threads": threads, "feeds": str(feeds_path),
                "member": LEVEL_MEMBERS[level], "fallback": LAYOUT_FALLBACK}
        try:
            self._process = subprocess.Popen(
                [str(python), "-c", BASELINE_TIMER, json.dumps(args)], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
        except OSError as error:
            self._folder.cleanup()
            raise EngineError(engine, level, model, f"could not start the baseline's Python {python}: {error}") from error
        self.pid = self._process.pid
        self.version = json.loads(self._line(START_TIMEOUT_S, "open the model"))["version"]

    def block(self, runs: int) -> float:
        self._process.stdin.write(f"{runs}\n")
        self._process.stdin.flush()
        return float(self._line(BLOCK_TIMEOUT_S, f"time {runs} runs"))

    def _line(self, timeout_s: float, step: str) -> str:
        # One line per request, flushed by the child: nothing waits in the pipe's buffer past it.
        ready, _, _ = select.select([self._process.stdout], [], [], timeout_s)
        if not ready:
            self._process.kill()
            raise EngineError(self.engine, self.level, self.model,
                              f"the baseline's Python did not {step} within {timeout_s:g} s")
        line = self._process.stdout.readline()
        if not line:
            self._process.wait(timeout=timeout_s)
            problem = (self._process.stderr.read() or "").strip().splitlines()[-3:]
            raise EngineError(self.engine, self.level, self.model,
                              f"the baseline's Python could not {step}: {' / '.join(problem) or 'it exited'}")
        return line.strip()

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.stdin.close()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process.stdout.close()
        self._process.stderr.close()
        self._folder.cleanup()

    def __enter__(self) -> BaselineProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
