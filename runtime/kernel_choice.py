"""Which kernel library a session uses, measured on this machine rather than assumed.

MKL's packed SGEMM was the fastest way to multiply by a constant weight on the Intel Xeon the
project was tuned on; on an AMD EPYC (Zen 4, AVX-512) it is the slowest of the three candidates,
because MKL takes its AVX-512 paths on Intel processors only (issue 14). So at session creation
each library this process can load is timed on the model's own shapes, and the fastest is used:

  gemm  products against constant weights (MatMul, Gemm, FusedMatMul, FusedGemm, Attention's
        QKV projection): MKL packed, oneDNN matmul with the weight reordered once, numpy's BLAS
  conv  channels-last convolutions (NhwcFusedConv, the layout level's): oneDNN, im2col + BLAS,
        timed on every distinct convolution of the model, weighted by how often it occurs
  wait  whether MKL's and oneDNN's OpenMP workers sleep as soon as a call is done or spin 1 ms
        first (runtime/kernels/openmp.py): each of the two libraries races once per wait
        ("onednn/sleep", "onednn/spin"), and the session runs with its winner's

Why the wait is raced: on the quiet 2-core AMD EPYC VM (Firecracker, guest halt polling off)
a race between sleeping oneDNN and spinning OpenBLAS chose OpenBLAS for BERT-base's products
(147 against 237 ms) and im2col for ResNet-50's convolutions, where on the same CPU under load,
when no virtual CPU sits halted, oneDNN had won both (104 against 122 ms; 7.6 against 12.4). The
likely reason: a worker that sleeps after each product leaves its CPU halted, and the next
product waits for the hypervisor to run it again; so the race lets each library spin as well.

Candidates take turns, round after round, and each keeps its best time per shape, so a burst of
load from another process on a shared machine costs all of them alike. A GEMM candidate is timed
with the one-thread pass that follows a product in a model (`time_gemm`): a library whose
workers spin after a product slows that pass down on a busy machine, and a model run pays it. A model whose products
are too small to tell apart (or that has none with static shapes) gets the machine's choice on
BERT-base's shapes instead. Every result is cached per machine (CPU model, its vector extensions,
thread count, library versions, shapes) in `$FUSIONWATCH_CACHE_DIR/kernel_choices.json`
(default `~/.cache/fusionwatch`), so a machine measures a model once.

`SessionOptions.kernel_libraries` fixes a family's library instead ({"gemm": "numpy"}); the
session says what it chose and why in `session.kernel_choices`, and its profile trace carries
the same under the `session_initialization` event's args.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import json
import math
import os
import platform
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import numpy as np
import onnx_ir as ir

from runtime.kernels import compiled, gemm, libraries, onednn, onednn_matmul, openmp

# Below this many GEMM FLOPs a run, a model's products take too little time to rank libraries
# by; the machine's choice on REFERENCE_GEMM_SHAPES is used.
MIN_MEASURED_GEMM_FLOPS = 50e6
# BERT-base at sequence 128: the QKV projection, the attention output, the MLP's two products.
REFERENCE_GEMM_SHAPES = [(128, 768, 2304, 1), (128, 768, 768, 1), (128, 768, 3072, 1), (128, 3072, 768, 1)]
MAX_SHAPES = 4  # the largest shapes by their share of a run's FLOPs; enough to rank libraries
ROUNDS = 8  # timed calls per candidate and shape; their lower quartile counts
_SETTLE_S = 0.15  # before each candidate's block: the last library's workers go back to sleep (OpenBLAS's spin ~0.1 s)
_OPENMP_SETTLE_S = 0.01  # after an OpenMP library's block: its workers spin 1 ms at most
_HOPELESS = 2.0  # after two rounds, an entrant this many times slower than the fastest stops
_CLOSE = 0.05  # entrants within 5% of the fastest after `ROUNDS` race as many rounds again
CONV_ROUNDS = 4  # a ResNet-50 round is ~24 distinct convolutions, 50-70 ms per candidate
MAX_CONVS = 32  # distinct convolutions timed, the costliest shares first (ResNet-50 has 24)
DYNAMIC_ROWS = 128  # rows assumed for a product whose A has symbolic dimensions
_VECTOR_EXTENSIONS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
)
_GEMM_OPS = {("", "MatMul"), ("", "Gemm"), ("com.microsoft", "FusedMatMul"), ("com.microsoft", "FusedGemm"),
             ("com.microsoft", "Attention")}  # fmt: skip
# numpy's OpenBLAS must beat the others by 10% to be chosen: the race times each product with
# one pass after it, but in a model's run OpenBLAS's workers spin for ~0.1 s after each product,
# taking cores from all the compiled loops between products (runtime/kernels/gemm.py: BERT-base
# 124 -> 167 ms), and on a loaded machine spinning workers lose far more than sleeping ones
# (ResNet-50's convolutions).
# With one thread (intra_op_num_threads=1) OpenBLAS has no workers to spin, and no handicap: on
# the 2-core AMD EPYC a one-thread race timed numpy 9.6% ahead of MKL on BERT-base's products
# and chose MKL, which then ran the tiny BERT's products 1.2-1.7x slower than numpy would.
_HANDICAP = {"numpy": 1.1}
_HANDICAP_NOTE = "10% (its workers spin between products)"
# What a race times, per family; part of the cache key, so that a cached result measured another
# way is measured again.
_TIMED = {"gemm": "product, then a one-thread pass over its output; lower quartile",
          "conv": "every distinct convolution, weighted by its count; lower quartile"}
_cache_lock = threading.Lock()
_SEEN: dict[tuple[str, str], dict] = {}  # this process's reads and measurements, by (cache file, key)


@dataclass(frozen=True)
class CpuInfo:
    model: str
    vendor: str
    extensions: list[str]  # the vector extensions among _VECTOR_EXTENSIONS this CPU has

    def __str__(self) -> str:
        return f"{self.model} ({self.vendor}; {' '.join(self.extensions) or 'no vector extensions listed'})"


@dataclass(frozen=True)
class KernelChoice:
    family: str  # "gemm", "conv" or "wait"
    library: str
    reason: str
    timings_ms: dict[str, float] = field(default_factory=dict)  # candidate -> ms over `shapes`
    shapes: list[list[int]] = field(default_factory=list)  # what was timed
    wait: str | None = None  # how the winner's OpenMP workers waited ("sleep", "spin"); None: no OpenMP


@dataclass(frozen=True)
class KernelChoices:
    cpu: CpuInfo
    threads: int
    gemm: KernelChoice
    conv: KernelChoice
    wait: KernelChoice  # how MKL's and oneDNN's idle workers wait between calls

    def libraries(self) -> dict[str, str]:
        """{family: library} for the CPU kernels to read; empty on a GPU backend, whose kernels
        have no choice to make."""
        chosen = {"gemm": self.gemm.library, "conv": self.conv.library, "wait": self.wait.library}
        return {f: lib for f, lib in chosen.items() if lib in libraries.CANDIDATES[f]}

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        return (
            f"gemm: {self.gemm.library} ({self.gemm.reason}); conv: {self.conv.library} ({self.conv.reason}); "
            f"wait: {self.wait.library} ({self.wait.reason})"
        )


def cpu_info() -> CpuInfo:
    """The CPU's model name, vendor and vector extensions, from /proc/cpuinfo where there is one."""
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError):  # not Linux: platform's less detailed answer below
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
            if key.strip() == "flags":
                break
    flags = set(fields.get("flags", "").split())
    return CpuInfo(
        model=fields.get("model name") or platform.processor() or platform.machine(),
        vendor=fields.get("vendor_id", "unknown"),
        extensions=[name for name in _VECTOR_EXTENSIONS if name in flags],
    )


def choose(
    model: ir.Model, threads: int, fixed: Mapping[str, str] | None = None, backend_name: str = "cpu"
) -> KernelChoices:
    """Each family's library for this model on this machine; `fixed` ones are taken as given."""
    fixed = dict(fixed or {})
    unknown = {f: lib for f, lib in fixed.items() if lib not in libraries.CANDIDATES.get(f, ())}
    if unknown:
        raise ValueError(f"kernel_libraries {unknown}: the candidates are {libraries.CANDIDATES}")
    threads = threads or os.cpu_count() or 1
    cpu = cpu_info()
    if backend_name != "cpu":
        off = f"the {backend_name} backend runs its own kernels"
        return KernelChoices(
            cpu, threads, *(KernelChoice(family, backend_name, off) for family in ("gemm", "conv", "wait"))
        )
    gemm_choice = _choose_gemm(model, cpu, threads, fixed.get("gemm"))
    conv_choice = _choose_conv(model, cpu, threads, fixed.get("conv"))
    return KernelChoices(cpu, threads, gemm_choice, conv_choice, _choose_wait(gemm_choice, conv_choice, fixed.get("wait")))


def _choose_wait(gemm_choice: KernelChoice, conv_choice: KernelChoice, fixed: str | None) -> KernelChoice:
    """The OpenMP wait the chosen libraries were fastest with: the convolutions' where oneDNN
    runs them (they were timed on the model's own nodes, where the products may have been timed
    on BERT-base's shapes), else the products'."""
    if fixed is not None:
        return KernelChoice("wait", fixed, "set by SessionOptions.kernel_libraries")
    if not openmp.available():
        return KernelChoice("wait", "sleep", "no Intel OpenMP runtime here (the mkl extra) to set it on")
    if openmp.user_blocktime() is not None:
        return KernelChoice("wait", "sleep", f"not chosen: KMP_BLOCKTIME={openmp.user_blocktime()} set by the user holds")
    for choice in (conv_choice, gemm_choice):
        if choice.wait is not None:
            return KernelChoice(
                "wait", choice.wait, f"{choice.family} on {choice.library} was fastest with its workers' {choice.wait}"
            )
    return KernelChoice("wait", "sleep", "the default: no OpenMP library was raced with its waits here")


# ---- products against constant weights ------------------------------------------------------


def gemm_candidates() -> list[str]:
    """The GEMM libraries this process can load, in tie-breaking order."""
    loadable = {"mkl-packed": gemm.available(), "onednn": onednn.available(), "numpy": True}
    return [name for name in libraries.CANDIDATES["gemm"] if loadable[name]]


_OPENMP_LIBRARIES = ("mkl-packed", "onednn")


def with_waits(candidates: list[str]) -> list[str]:
    """The race's entrants: each OpenMP library once per wait ("onednn/spin", "onednn/sleep"),
    since which wait is faster depends on the machine (runtime/kernels/openmp.py)."""
    if not openmp.settable():
        return candidates
    return [f"{c}/{wait}" if c in _OPENMP_LIBRARIES else c for c in candidates
            for wait in (openmp.WAITS if c in _OPENMP_LIBRARIES else [None])]  # fmt: skip


def split(entrant: str) -> tuple[str, str | None]:
    """("onednn", "spin") from "onednn/spin"; ("numpy", None) from "numpy"."""
    library, _, wait = entrant.partition("/")
    return library, wait or None


def gemm_shapes(model: ir.Model) -> list[tuple[int, int, int, int]]:
    """(M, K, N, count) of the model's float32 products against a constant 2-D weight, the
    kernels that prepare such weights once (runtime/kernels/gemm.py), largest share first."""
    counts: Counter = Counter()
    for node in model.graph:
        domain = "" if node.domain == "ai.onnx" else node.domain
        if (domain, node.op_type) not in _GEMM_OPS or len(node.inputs) < 2:
            continue
        a, b = node.inputs[0], node.inputs[1]
        if a is None or b is None or b.const_value is None or b.is_graph_input():
            continue
        if (
            b.dtype != ir.DataType.FLOAT
            or b.shape is None
            or len(b.shape) != 2
            or a.shape is None
            or len(a.shape) < 1
        ):
            continue
        trans_b = node.op_type in ("Gemm", "FusedGemm") and _int_attribute(node, "transB")
        n, k = b.shape if trans_b else reversed(b.shape)
        trans_a = node.op_type in ("Gemm", "FusedGemm") and _int_attribute(node, "transA")
        leading = list(a.shape)[-1:] if trans_a else list(a.shape)[:-1]
        static = [d for d in leading if isinstance(d, int)]
        rows = math.prod(static) * (DYNAMIC_ROWS if len(static) < len(leading) else 1)
        counts[(int(rows), int(k), int(n))] += 1
    shapes = [(*shape, count) for shape, count in counts.items() if min(shape) > 0]
    return sorted(shapes, key=lambda s: -_flops(s))


def _int_attribute(node: ir.Node, name: str) -> int:
    attribute = node.attributes.get(name)
    return 0 if attribute is None else int(attribute.value)


def _flops(shape) -> float:
    m, k, n, count = shape
    return 2.0 * m * k * n * count


def _choose_gemm(model: ir.Model, cpu: CpuInfo, threads: int, fixed: str | None) -> KernelChoice:
    candidates = gemm_candidates()
    if fixed is not None:
        if fixed not in candidates:
            raise ValueError(f"kernel_libraries gemm={fixed!r} is not loadable here; loadable: {candidates}")
        return KernelChoice("gemm", fixed, "set by SessionOptions.kernel_libraries")
    shapes = gemm_shapes(model)
    scope = "the model's"
    if not shapes:
        # Other products (convolutions' im2col, attention's) still run on the chosen library.
        shapes, scope = (
            REFERENCE_GEMM_SHAPES,
            "BERT-base's (this model has no constant-weight product of known shape)",
        )
    elif sum(_flops(s) for s in shapes) < MIN_MEASURED_GEMM_FLOPS:
        shapes, scope = REFERENCE_GEMM_SHAPES, "BERT-base's (this model's are too small to rank libraries by)"
    shapes = shapes[:MAX_SHAPES]
    return _measured(
        "gemm", candidates, shapes, cpu, threads, time_gemm, f"{scope} {len(shapes)} largest GEMM shapes"
    )


def time_gemm(library: str, shape) -> Callable[[], object]:
    """A call that runs one product of `shape` on `library`, its weight prepared beforehand,
    and then, on this thread alone, the pass a model runs over a product's output next (the
    compiled bias-GELU loop, as a fused layer's MLP does; SkipLayerNormalization and the masked
    softmax are such passes too).

    Why the pass is timed with the product: it is where the libraries differ beyond their
    GEMM speed. OpenBLAS's workers spin for ~0.1 s after each product, and on a machine with
    more runnable threads than cores they take time from this thread's pass; MKL's and
    oneDNN's sleep. Timed bare, OpenBLAS won BERT-base's race on the loaded 2-core Xeon
    (85 ms against MKL's 112) and then ran the model 3x slower than MKL (805 against 268 ms,
    fastest of 10 runs each); with the pass in the timing it loses there, as it should, and
    on an idle machine, where the spinning worker has a core of its own, the pass costs every
    library alike."""
    library, wait = split(library)
    m, k, n, _ = shape
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32)
    after = np.empty((m, n), np.float32)
    if library == "mkl-packed":
        weight = gemm.PackedWeight(b)
        product = partial(gemm.matmul_packed, a, weight)
    elif library == "onednn":
        weight = onednn_matmul.MatMulWeight(b)
        product = partial(weight.matmul, a)
    else:
        product = partial(np.matmul, a, b)

    def call():
        with openmp.waiting(wait):
            compiled.bias_gelu_rows(product(), bias, after)

    return call


# ---- channels-last convolutions --------------------------------------------------------------


def conv_nodes(model: ir.Model) -> list[tuple[ir.Node, tuple[int, ...], int]]:
    """The distinct NhwcFusedConv nodes oneDNN could run (float32 constant weight and bias, an input shape
    static but for the batch, taken as 1): one node per distinct convolution (input and weight
    shape, attributes, residual or not), with its input shape and how many nodes share it,
    costliest share of a run first."""
    found: dict[tuple, list] = {}
    for node in model.graph:
        if node.op_type != "NhwcFusedConv" or len(node.inputs) < 2:
            continue
        x, w = node.inputs[0], node.inputs[1]
        b = node.inputs[2] if len(node.inputs) > 2 else None
        if (
            x is None
            or w is None
            or w.const_value is None
            or w.is_graph_input()
            or w.dtype != ir.DataType.FLOAT
            or (b is not None and (b.const_value is None or b.is_graph_input()))  # timed with the model's bias
        ):
            continue
        if x.shape is None or x.dtype != ir.DataType.FLOAT:
            continue
        shape = [
            1 if axis == 0 and not isinstance(d, int) else d for axis, d in enumerate(x.shape)
        ]  # batch 1
        if not all(isinstance(d, int) for d in shape):
            continue
        key = (tuple(shape), _conv_signature(node))
        if key in found:
            found[key][2] += 1
        else:
            found[key] = [node, tuple(shape), 1]
    return sorted((tuple(item) for item in found.values()), key=lambda item: -conv_flops(*item))


def _conv_signature(node: ir.Node) -> tuple:
    """What makes two convolutions of one input shape the same work: the weight's shape, the
    attributes (strides, pads, group, activation) and whether a residual Z is added."""
    attributes = tuple(sorted((name, repr(attribute.value)) for name, attribute in node.attributes.items()))
    residual = len(node.inputs) > 3 and node.inputs[3] is not None
    return (tuple(node.inputs[1].shape), attributes, residual)


def conv_flops(node: ir.Node, shape: tuple[int, ...], count: int) -> float:
    """2 x output positions x weight size x count; the output's positions from the strides
    (a stride-2 convolution does a quarter of the work its input size suggests)."""
    strides = node.attributes.get("strides")
    steps = list(strides.value) if strides is not None else [1] * (len(shape) - 2)
    positions = shape[0] * math.prod(-(-size // step) for size, step in zip(shape[1:-1], steps, strict=False))
    return 2.0 * positions * node.inputs[1].const_value.numpy().size * count


def _choose_conv(model: ir.Model, cpu: CpuInfo, threads: int, fixed: str | None) -> KernelChoice:
    candidates = [name for name in libraries.CANDIDATES["conv"] if name != "onednn" or onednn.available()]
    if fixed is not None:
        if fixed not in candidates:
            raise ValueError(f"kernel_libraries conv={fixed!r} is not loadable here; loadable: {candidates}")
        return KernelChoice("conv", fixed, "set by SessionOptions.kernel_libraries")
    nodes = conv_nodes(model)[:MAX_CONVS]
    if len(candidates) == 1:
        return KernelChoice("conv", candidates[0], f"the only one loadable ({onednn.unavailable_reason()})")
    if not nodes:
        return KernelChoice("conv", candidates[0], "no channels-last convolution with static shapes to time")
    opset = model.opset_imports.get("com.microsoft", 1)
    return _measured(
        "conv", candidates, nodes, cpu, threads, lambda lib, item: _time_conv(lib, item, opset),
        f"the model's {len(nodes)} distinct channels-last convolutions ({sum(n[2] for n in nodes)} nodes)",
        min(ROUNDS, CONV_ROUNDS),
    )  # fmt: skip


def _time_conv(library: str, item, opset: int) -> Callable[[], object]:
    from runtime.kernels.conv_nhwc import NhwcFusedConv

    library, wait = split(library)
    node, shape, _ = item
    kernel = NhwcFusedConv(node, opset)
    x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
    inputs = [x] + [None if v is None else v.const_value.numpy() for v in node.inputs[1:3]]
    chosen = {"conv": library} if wait is None else {"conv": library, "wait": wait}

    def call():
        with libraries.using(chosen):
            return kernel.run(*inputs)

    if len(node.inputs) > 3 and node.inputs[3] is not None:  # Z, the residual: zeros of Y's shape
        inputs += [None] * (3 - len(inputs)) + [np.zeros_like(call()[0])]
    return call


# ---- measuring and caching -------------------------------------------------------------------


def _measured(family, libraries_here, shapes, cpu, threads, make_call, scope, rounds=None) -> KernelChoice:
    candidates = with_waits(libraries_here)
    described = [list(_shape_key(s)) for s in shapes]
    key = json.dumps(
        {"cpu": cpu.model, "ext": cpu.extensions, "threads": threads, "family": family,
         "candidates": {c: _version(c) for c in candidates}, "shapes": described,
         "timed": _TIMED[family], "rounds": rounds or ROUNDS},
        sort_keys=True,
    )  # fmt: skip
    cache = _cache_path()
    entry = _SEEN.get((str(cache), key)) or _read_cache(cache).get(key)
    if entry is None:
        try:
            timings = race_libraries(candidates, shapes, make_call, rounds)
        except (ValueError, TypeError, IndexError, RuntimeError, ArithmeticError) as error:
            # Shapes or constants an invalid model contradicts itself with: nothing to time. The
            # kernels then refuse the node by name when the plan builds them (a GraphPlanError).
            return KernelChoice(
                family, libraries_here[0], f"not measured: timing {scope} failed ({type(error).__name__}: {error})"
            )
        entry = {"timings_ms": timings, "measured": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")}
        _write_cache(cache, key, entry)
        where = "measured now"
    else:
        where = f"measured {entry['measured']}, cached in {cache}"
    _SEEN[(str(cache), key)] = entry
    timings = entry["timings_ms"]
    handicap = _HANDICAP if threads != 1 else {}
    winner = min(candidates, key=lambda c: (timings[c] * handicap.get(c, 1.0), candidates.index(c)))
    ranking = ", ".join(f"{c} {timings[c]:.2f} ms" for c in sorted(candidates, key=timings.get))
    handicaps = [c for c in candidates if c in handicap and len(candidates) > 1]
    note = f"; {', '.join(handicaps)} must win by {_HANDICAP_NOTE}" if handicaps else ""
    reason = f"fastest on {scope}: {ranking} ({where}{note})"
    library, wait = split(winner)
    return KernelChoice(family, library, reason, dict(timings), described, wait)


def _shape_key(shape) -> tuple:
    if isinstance(shape[0], ir.Node):  # a convolution: its input shape, weight's, strides, count
        node, x_shape, count = shape
        strides = node.attributes.get("strides")
        steps = tuple(strides.value) if strides is not None else ()
        return (*x_shape, *node.inputs[1].shape, *steps, count)
    return tuple(shape)


def race_libraries(
    candidates, shapes, make_call, rounds: int | None = None, clock: Callable[[], float] = time.perf_counter
) -> dict[str, float]:
    """ms a run of `shapes` (each weighted by its count) takes on each candidate: per shape, the
    lower quartile of `rounds` (ROUNDS) timed calls, each the difference of two readings of
    `clock` (seconds; a test passes one its calls advance, so no machine's load decides it).

    One candidate at a time, as a session runs one: timed in turn, call by call, each library's
    idle thread pool took cores from the next (oneDNN's products for a BERT-base layer measured
    8.5 ms on their own and 15-18 when MKL's calls alternated with them). So each round times
    every candidate in a block of its own, after a pause (OpenBLAS's workers spin for ~0.1 s
    after each call; MKL's and oneDNN's for 1 ms at most, so a block after theirs waits less)
    and an untimed call that wakes its threads; the order reverses from one round to the next,
    so that a change in the machine's load during the measurement weighs on every candidate
    alike. Inside a block the calls follow one another as a model's products do, each with the
    one-thread pass after it, so a library whose workers sleep between calls pays for waking
    them as a session would.

    The lower quartile, neither the best time nor the median. Not the best: a session pays for the
    typical call. On the loaded 2-core Xeon, OpenBLAS's best products matched MKL's (BERT-base's
    fastest nodes summed to 139 ms against 142) while its model runs took 956 ms at the median
    against MKL's 292: its threads wait for each other by spinning, which on a machine with more
    runnable threads than cores now and then stalls a product for a whole time slice. A best-of
    race chose it half the time. Not the median: on the quiet Zen 5 VM a round's GPT-2 products
    took either about 50 ms or about 88 ms, for every entrant alike (the host now and then runs
    our second virtual CPU less: the same two-mode pattern shows in whole-model runs), in spells
    of a few rounds; with half the rounds slow the median fell on one side of the gap for one
    entrant and on the other side for the next, and two `make bench` races of GPT-2 an hour apart
    chose "onednn/sleep" by 33% and "onednn/spin" by 39%, where whole runs of that model are 10%
    faster spinning (`python -m bench.fixed_library`). An entrant must now be slow in three
    rounds of four to lose on it.

    An entrant more than `_HOPELESS` times slower than the fastest after two rounds (one in each
    order) runs no more rounds: no handicap or later round would make it win, and on a loaded
    machine OpenBLAS's im2col alone took 1.2 s a round of ResNet-50's convolutions. Its time is
    the lower quartile of the rounds it ran. Entrants still within `_CLOSE` of the fastest after all
    the rounds race as many rounds again among themselves, so a close call is decided on twice
    the calls.
    """
    calls = {c: [make_call(c, shape) for shape in shapes] for c in candidates}
    samples: dict[str, list[list[float]]] = {c: [[] for _ in shapes] for c in candidates}
    weights = [shape[-1] for shape in shapes]

    def total_ms(c: str) -> float:
        return round(1e3 * sum(_lower_quartile(t) * w for t, w in zip(samples[c], weights, strict=True)), 4)

    rounds = rounds or ROUNDS
    running = list(candidates)
    previous = _timed_rounds(running[:], calls, samples, 2, None, clock, first=True)
    # Both orders seen: an entrant far behind cannot win; it stops here.
    fastest = min(total_ms(c) for c in running)
    running = [c for c in running if total_ms(c) <= _HOPELESS * fastest]
    previous = _timed_rounds(running, calls, samples, rounds - 2, previous, clock)
    fastest = min(total_ms(c) for c in running)
    close = [c for c in running if total_ms(c) <= (1 + _CLOSE) * fastest]
    if len(close) > 1:
        # A close call is settled by more calls rather than by the luck of the first ones: on the
        # quiet AMD EPYC a GPT-2 race chose MKL by 2% (175.5 against oneDNN's 178.9 ms), and
        # the model then ran 1.4x slower on it than on oneDNN.
        _timed_rounds(close, calls, samples, rounds, previous, clock)
    return {c: total_ms(c) for c in candidates}


def _lower_quartile(times: list[float]) -> float:
    return float(np.percentile(times, 25))


def _timed_rounds(
    entrants, calls, samples, count: int, previous: str | None, clock: Callable[[], float], first: bool = False
) -> str | None:
    """`count` rounds of `entrants`' blocks (see `race_libraries`), their times appended to `samples`;
    the last entrant timed, whose workers the next block's pause waits out."""
    for index in range(count):
        for c in entrants if index % 2 == 0 else entrants[::-1]:
            time.sleep(_settle_s(previous))
            previous = c
            calls[c][0]()  # wakes the library's threads (and, the first time, builds primitives)
            if first and index == 0:
                for call in calls[c][1:]:
                    call()
            for call, times in zip(calls[c], samples[c], strict=True):
                started = clock()
                call()
                times.append(clock() - started)
    return previous


def _settle_s(previous: str | None) -> float:
    """The pause before a block: OpenBLAS's workers spin for ~0.1 s after its last call, MKL's
    and oneDNN's for at most the 1 ms of the "spin" wait."""
    if previous is not None and split(previous)[0] in _OPENMP_LIBRARIES:
        return min(_SETTLE_S, _OPENMP_SETTLE_S)
    return _SETTLE_S


def _version(entrant: str) -> str:
    distribution = {"mkl-packed": "mkl", "onednn": "onednn-cpu-gomp", "numpy": "numpy"}[split(entrant)[0]]
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _cache_path() -> Path:
    root = os.environ.get("FUSIONWATCH_CACHE_DIR") or Path.home() / ".cache" / "fusionwatch"
    return Path(root) / "kernel_choices.json"


def _read_cache(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        warnings.warn(f"kernel choice cache {path} unreadable, measuring again: {error}", stacklevel=3)
        return {}


def _write_cache(path: Path, key: str, entry: dict) -> None:
    """Merge one entry into the cache file, replaced atomically (sessions in several processes
    may write at once; the last one's view wins, losing at worst an entry to measure again)."""
    with _cache_lock:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            data = _read_cache(path)
            data[key] = entry
            temporary = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            temporary.write_text(json.dumps(data, indent=1, sort_keys=True))
            os.replace(temporary, path)
        except OSError as error:
            warnings.warn(
                f"kernel choice not cached ({path}: {error}); it is measured again next time", stacklevel=3
            )
