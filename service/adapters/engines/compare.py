"""Mark-all comparison: every tensor that survives optimization, fused graph against unfused, on one feed set.

Polygraphy's `--onnx-outputs mark all` for fusions: a tensor survives when the optimized graph still
has a node producing a value of that name (a fusion's new node takes over the names of the outputs it
replaces, so a fused node is compared at its boundary; what it swallowed no longer exists). Tensors
are compared in the unfused graph's topological order, so the first that diverges is where an error
starts, and everything after it may only be carrying it along.

Memory stays bounded: the tensors are fetched in chunks whose bytes (sized on one run of the unfused
graph) fit half of `budget_bytes` per side, so at most one chunk of each graph is alive at once; a
graph needing more than MAX_CHUNKS runs, or holding a single tensor over half the budget, is marked
`too-large` instead of compared. The engines supply the fetching (compare_native.py: our executor's
`run_watching`; compare_onnxruntime.py: onnxruntime sessions with the chunk marked as outputs).

A tensor diverges when it leaves its tolerance of the unfused one (service/domain/tolerances.py: the
project's rtol/atol for float32, derived from the precision for float16/bfloat16, by the narrowest
type its value passed through, widened with the reductions it is computed through), when its shape
or (for integers and booleans) any value differs, or
when it holds NaN or inf where the unfused graph has a finite number: that last one is a mismatch
whatever the tolerance. A graph output out of tolerance is named with the tolerance it left
(`Comparison.failed_outputs`), so an alert says which bound applied to which output.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import cache
from typing import Any

import ml_dtypes
import numpy as np

from service.adapters.engines.precision import TensorTolerances
from service.domain.tolerances import is_float

BUDGET_BYTES = 512 * 2**20  # both sides' chunks together
MAX_CHUNKS = 64  # runs of each graph; beyond this a comparison takes longer than the job itself many times over
FALLBACK_CHUNK = 32  # tensors per chunk when no sizing run was possible
MAX_ROWS = 64  # rows of the per-node table kept with a result
MAX_FAILED_OUTPUTS = 4  # graph outputs named with their tolerance; `diverging` says how many in all
MAX_SENTENCE = 500  # characters of each (service/schemas/numerics.py takes no more)

Fetch = Callable[[Sequence[str]], dict[str, np.ndarray]]


@dataclass(frozen=True)
class Producer:
    """A node as the comparison names it: its name, op key, and in the optimized graph the rule that
    made it and the fused op it belongs to (itself, or the fused node a helper such as a NaN guard
    or an output Reshape follows)."""

    node: str
    op: str
    rule: str | None = None
    fused_op: str | None = None


@dataclass(frozen=True)
class Surviving:
    tensor: str
    reference: Producer
    optimized: Producer
    graph_output: bool = False


@dataclass
class TensorError:
    tensor: str
    reference_node: str
    reference_op: str
    node: str
    op: str
    rule: str | None
    fused_op: str | None
    max_abs: float
    max_rel: float
    nonfinite: str | None  # "NaN", "inf" or "NaN and inf" where the unfused graph is finite
    diverges: bool
    problem: str | None = None  # a shape or dtype that differs, or integers that differ
    tolerance: str | None = None  # the bound a float tensor was held to, with the type that set it

    def failed_output(self) -> str:
        """"output 'logits' (float16): max abs err 3.0e-02 > atol … + rtol … × |ref|", for an alert."""
        why = self.problem or self.nonfinite and f"{self.nonfinite} where the unfused graph is finite"
        if why:
            return f"output '{self.tensor}': {why}"
        return f"output '{self.tensor}' ({self.tolerance}): max abs err {self.max_abs:.1e}, max rel {self.max_rel:.1e}"

    def to_dict(self) -> dict[str, Any]:
        return {key: _json_number(value) for key, value in asdict(self).items()}


@dataclass
class Comparison:
    """What comparing one feed set found; `status` "compared", "too-large" or "unavailable"."""

    feed_set: str
    status: str
    reason: str | None = None
    tensors: int = 0  # compared
    diverging: int = 0
    first: TensorError | None = None
    outputs_max_abs: float = 0.0  # over the graph outputs: the numbers the numeric check has always quoted
    outputs_max_rel: float = 0.0
    outputs_ok: bool = True
    failed_outputs: list[str] = field(default_factory=list)  # the first MAX_FAILED_OUTPUTS, with tolerances
    new_nonfinite: bool = False  # NaN or inf in a tensor where the unfused graph has none
    rows: list[TensorError] = field(default_factory=list)  # fusion boundaries and divergences, in order

    @property
    def ok(self) -> bool:
        return self.outputs_ok and not self.new_nonfinite

    def to_dict(self) -> dict[str, Any]:
        return {
            "feed_set": self.feed_set,
            "status": self.status,
            "reason": self.reason,
            "tensors": self.tensors,
            "diverging": self.diverging,
            "first": self.first.to_dict() if self.first else None,
            "outputs_max_abs": _json_number(self.outputs_max_abs),
            "outputs_max_rel": _json_number(self.outputs_max_rel),
            "outputs_ok": self.outputs_ok,
            "failed_outputs": list(self.failed_outputs),
            "new_nonfinite": self.new_nonfinite,
            "rows": [row.to_dict() for row in self.rows],
        }


def surviving_tensors(
    reference: dict[str, Producer], optimized: dict[str, Producer], graph_outputs: Iterable[str]
) -> list[Surviving]:
    """The tensors both graphs produce, in the reference's order (`reference` maps each node output
    to its producer, in topological order)."""
    outputs = set(graph_outputs)
    return [
        Surviving(name, producer, optimized[name], name in outputs)
        for name, producer in reference.items()
        if name in optimized
    ]


def plan_chunks(
    names: Sequence[str], sizes: dict[str, int] | None, budget_bytes: int = BUDGET_BYTES
) -> list[list[str]] | str:
    """Consecutive chunks of `names` each fitting half the budget, or why the model is too large."""
    if sizes is None:
        chunks = [list(names[i : i + FALLBACK_CHUNK]) for i in range(0, len(names), FALLBACK_CHUNK)]
    else:
        side = budget_bytes // 2
        chunks, current, used = [], [], 0
        for name in names:
            size = sizes.get(name, 0)
            if size > side:
                return (
                    f"tensor '{name}' alone holds {size / 2**20:.0f} MiB, over half the comparison's "
                    f"{budget_bytes / 2**20:.0f} MiB budget"
                )
            if current and used + size > side:
                chunks.append(current)
                current, used = [], 0
            current.append(name)
            used += size
        if current:
            chunks.append(current)
    if len(chunks) > MAX_CHUNKS:
        return (
            f"its {len(names)} surviving tensors need {len(chunks)} runs of each graph within the "
            f"{budget_bytes / 2**20:.0f} MiB budget (at most {MAX_CHUNKS})"
        )
    return chunks


def compare_tensors(
    feed_set: str,
    surviving: Sequence[Surviving],
    fetch_reference: Fetch,
    fetch_optimized: Fetch,
    sizes: dict[str, int] | None,
    tolerances: TensorTolerances,
    budget_bytes: int = BUDGET_BYTES,
) -> Comparison:
    """Compare every surviving tensor, a chunk at a time; see the module docstring."""
    chunks = plan_chunks([s.tensor for s in surviving], sizes, budget_bytes)
    too_large = chunks if isinstance(chunks, str) else None
    if too_large is not None:
        # The graph outputs are still checked, as they were before any tensor was marked.
        surviving = [s for s in surviving if s.graph_output]
        chunks = [[s.tensor for s in surviving]]
    found = Tally(feed_set, surviving, tolerances)
    for chunk in chunks:
        optimized = fetch_optimized(chunk)
        found.add(chunk, fetch_reference(chunk), optimized)
        del optimized
    comparison = found.comparison()
    if too_large is not None:
        comparison.status, comparison.reason = "too-large", too_large
    return comparison


class Tally:
    """One feed set's comparison, built a chunk at a time, so an engine may run its chunks in whatever
    order costs it least (onnxruntime: every feed set through one session per chunk)."""

    def __init__(self, feed_set: str, surviving: Sequence[Surviving], tolerances: TensorTolerances) -> None:
        self._comparison = Comparison(feed_set, "compared")
        self._by_name = {s.tensor: s for s in surviving}
        self._order = {s.tensor: index for index, s in enumerate(surviving)}
        self._tolerances = tolerances
        self._diverging: list[TensorError] = []
        self._boundaries: list[TensorError] = []

    def add(self, names: Sequence[str], reference: dict[str, np.ndarray], optimized: dict[str, np.ndarray]) -> None:
        """Compare `names` (a chunk, in order); the values are dropped from both dicts as they are compared."""
        comparison = self._comparison
        for name in names:
            if name not in reference or name not in optimized:
                continue  # an optional output neither run produced
            error = tensor_error(self._by_name[name], reference.pop(name), optimized.pop(name), self._tolerances)
            comparison.tensors += 1
            if error.nonfinite:
                comparison.new_nonfinite = True
            if self._by_name[name].graph_output:
                comparison.outputs_max_abs = max(comparison.outputs_max_abs, error.max_abs)
                comparison.outputs_max_rel = max(comparison.outputs_max_rel, error.max_rel)
                comparison.outputs_ok = comparison.outputs_ok and not error.diverges
                if error.diverges and len(comparison.failed_outputs) < MAX_FAILED_OUTPUTS:
                    comparison.failed_outputs.append(error.failed_output()[:MAX_SENTENCE])
            if error.diverges:
                comparison.diverging += 1
                if comparison.first is None:
                    comparison.first = error
                if len(self._diverging) < MAX_ROWS // 2:
                    self._diverging.append(error)
            elif error.rule is not None and len(self._boundaries) < MAX_ROWS:
                self._boundaries.append(error)

    def comparison(self) -> Comparison:
        rows = self._diverging + self._boundaries[: MAX_ROWS - len(self._diverging)]
        self._comparison.rows = sorted(rows, key=lambda row: self._order[row.tensor])
        return self._comparison


def tensor_error(surviving: Surviving, want: Any, got: Any, tolerances: TensorTolerances) -> TensorError:
    want, got = np.asarray(want), np.asarray(got)
    ref, opt = surviving.reference, surviving.optimized
    row = TensorError(
        surviving.tensor, ref.node, ref.op, opt.node, opt.op, opt.rule, opt.fused_op,
        max_abs=0.0, max_rel=0.0, nonfinite=None, diverges=False,
    )  # fmt: skip
    if want.shape != got.shape:
        row.problem = f"shape {list(got.shape)}, unfused {list(want.shape)}"
        row.max_abs = row.max_rel = float("inf")
        row.diverges = True
        return row
    floats = is_float(want.dtype.name) and is_float(got.dtype.name)
    tolerance = tolerances.of(surviving.tensor, _narrower(want.dtype, got.dtype).name)
    if not floats and (tolerance is None or want.dtype != got.dtype):  # quantized integers: as numbers
        if want.dtype != got.dtype or not np.array_equal(want, got):
            row.problem = f"{got.dtype} values differ from the unfused {want.dtype} ones"
            row.max_abs = row.max_rel = float("inf")
            row.diverges = True
        return row
    want64, got64 = want.astype(np.float64), got.astype(np.float64)
    invented_nan = np.isnan(got64) & ~np.isnan(want64)
    invented_inf = np.isinf(got64) & np.isfinite(want64)
    kinds = [label for label, mask in (("NaN", invented_nan), ("inf", invented_inf)) if mask.any()]
    row.nonfinite = " and ".join(kinds) or None
    both_finite = np.isfinite(want64) & np.isfinite(got64)
    if both_finite.any():
        diff = np.abs(got64[both_finite] - want64[both_finite])
        row.max_abs = float(diff.max())
        row.max_rel = float((diff / np.maximum(np.abs(want64[both_finite]), 1e-12)).max())
    assert tolerance is not None  # both are floating types, or the same quantized integer type
    scale = _scale(want64, want.dtype) if tolerance.scaled else None
    close = np.isclose(got64, want64, rtol=tolerance.rtol, atol=tolerance.bound(scale or 0.0), equal_nan=True)
    own = _narrower(want.dtype, got.dtype).name
    passed = f", computed from {tolerance.dtype}" if tolerance.dtype != own else ""
    deep = f", {tolerance.depth} reduction{'s' if tolerance.depth > 1 else ''} deep" if tolerance.scaled else ""
    row.tolerance = f"{own}{passed}{deep}: {tolerance.describe(scale)}"
    row.diverges = bool(row.nonfinite) or not bool(close.all())
    if not close.all() and not row.nonfinite and row.max_abs == 0.0:
        row.max_abs = row.max_rel = float("inf")  # inf against a finite number, or of the other sign
    return row


def _narrower(a: np.dtype, b: np.dtype) -> np.dtype:
    return a if a.itemsize <= b.itemsize else b


def _scale(want64: np.ndarray, dtype: np.dtype) -> float:
    """The reference tensor's largest finite magnitude, at least the type's smallest normal number (a
    tensor of zeros is then held to a few subnormals, not to nothing)."""
    finite = np.abs(want64[np.isfinite(want64)])
    largest = float(finite.max()) if finite.size else 0.0
    return max(largest, float(ml_dtypes.finfo(dtype).tiny) if is_float(dtype.name) else 1.0)


def attribute(
    nodes: Iterable[tuple[str, str, Sequence[str], Sequence[str], str | None, bool]],
) -> dict[str, Producer]:
    """Each node output's producer, in order, from (name, op, inputs, outputs, rule, fused) per node.

    A node a rule created that is not itself the fused op (AttentionFusion's NaN guard after its
    MultiHeadAttention, an output Reshape) is attributed to the fused node of the same rule it reads
    from, so a row says which fusion's output it is.
    """
    producers: dict[str, Producer] = {}
    for name, op, inputs, outputs, rule, fused in nodes:
        fused_op = op if fused else None
        if rule is not None and not fused:
            fused_op = next(
                (producers[i].fused_op for i in inputs if i in producers and producers[i].rule == rule and producers[i].fused_op),
                None,
            )
        producer = Producer(name, op, rule, fused_op)
        for output in outputs:
            if output:
                producers[output] = producer
    return producers


def sizes_of(fetch_all: Callable[[Callable[[str, np.ndarray], None]], None]) -> dict[str, int]:
    """Bytes of each tensor, from one run that hands every watched value to a sink and keeps none."""
    sizes: dict[str, int] = {}

    def record(name: str, value: np.ndarray) -> None:
        sizes[name] = int(value.nbytes)

    fetch_all(record)
    return sizes


def _json_number(value: Any) -> Any:
    """JSON has no inf or NaN: an infinite error is stored as a string the pages print as is."""
    if isinstance(value, float) and not np.isfinite(value):
        return "inf" if value > 0 else ("-inf" if value < 0 else "nan")
    return value


def describe_row(first: Mapping[str, Any], feed_set: str | None = None) -> str:
    """The sentence for one stored row (TensorError.to_dict), as alerts and pages print it."""
    made_by = first.get("rule")
    op = first.get("fused_op") or first.get("op")
    if made_by:
        origin = f"output of {op} made by {made_by}"
        # Our driver names a rule's node after its anchor, so a fusion of a fused node carries the earlier
        # rule's name ("GroupQueryAttentionFusion/AttentionFusion//model/..."): the node the error may
        # have come in with.
        earlier = [part for part in str(first.get("node") or "").split("/")[1:] if part in _rule_names() and part != made_by]
        if earlier:
            origin += f" from what {', '.join(dict.fromkeys(earlier))} fused"
    else:
        origin = f"output of {first.get('op')} node '{first.get('node')}', no fusion's"
    text = f"first divergence at `{first['tensor']}` ({origin}): max abs {_as_text(first.get('max_abs'))}"
    if first.get("nonfinite"):
        text += f"; {first['nonfinite']} appears there"
    elif first.get("problem"):
        text += f"; {first['problem']}"
    if feed_set:
        text += f" (feed set {feed_set})"
    return text


@cache
def _rule_names() -> frozenset[str]:
    from optimizer.levels import known_rule_names

    return frozenset(known_rule_names())


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else f"{value:.1e}"
