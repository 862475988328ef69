"""A plan written out as one Python function, so that a run pays for its kernels and little else.

The executor's loop (runtime/executor.py) reads, per step, a tuple of input slots, builds an
argument list, calls the kernel, and walks the output and release tuples: about 1 µs of
interpreter work a node, as much as a small kernel's own. On a tiny model at level `disabled`
(228 steps) that work was as large as onnxruntime's whole run. Written out, the same steps are
one line each, with intermediates in local variables:

    def run_steps(v):
        x12 = k0(v[3], v[4])[0]                 # step 0, node 'Add_0'
        r = k1(x12); x13 = r[0]; x14 = r[1]; del r   # step 1
        del x12
        ...
        v[9] = x40                               # graph outputs back into the frame

`v` is the run's frame (runtime/plan.py's slots): it carries the feeds, initializers, constant
values and outer-scope values in, and the graph outputs out. An intermediate lives in a local
from the step that writes it to the step that last reads it (`del` then, where the plan
releases it), so memory is released where the loop would release it.

Every step is one line, and `step_at_line` maps a line of the function back to its step, so
an error inside a kernel still names the node and the values it was given (`failed_step`).
Nothing here fuses kernels: each node's kernel runs, in the plan's order, as in the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import CodeType, TracebackType
from typing import Any

from runtime.plan import SINK_SLOT, Step

_NAME = "<fusionwatch plan>"


class PlanFunction:
    """`run(values)` executes every step on a filled frame; see the module docstring."""

    def __init__(
        self,
        steps: Sequence[Step],
        runs: Sequence[Callable[..., Any]],
        produced: frozenset[int],
        outputs: Sequence[int],
    ) -> None:
        lines, self.step_at_line = _write(steps, produced, outputs)
        source = "def run_steps(v):\n" + "".join(f"    {line}\n" for line in lines) + "    return None\n"
        self._code: CodeType = compile(source, _NAME, "exec")
        namespace: dict[str, Any] = {f"k{i}": run for i, run in enumerate(runs)}
        for i, step in enumerate(steps):
            if step.memo is not None:
                namespace[f"m{i}"], namespace[f"c{i}"] = step.memo.results, step.memo.miss
        exec(self._code, namespace)  # noqa: S102 - source written above from slot numbers only
        self.run: Callable[[list[Any]], None] = namespace["run_steps"]
        self.source = source

    def failed_step(self, traceback: TracebackType | None) -> tuple[int, dict[str, Any]] | None:
        """(step index, the function's local values) for an exception raised in a step's line,
        or None when it was raised elsewhere."""
        while traceback is not None:
            frame = traceback.tb_frame
            if frame.f_code.co_filename == _NAME:
                step = self.step_at_line.get(traceback.tb_lineno)
                return None if step is None else (step, dict(frame.f_locals))
            traceback = traceback.tb_next
        return None


def _write(steps: Sequence[Step], produced: frozenset[int], outputs: Sequence[int]) -> tuple[list[str], dict[int, int]]:
    """The function body, a line per step plus `del` and output lines; and line -> step index."""
    lines: list[str] = []
    step_at_line: dict[int, int] = {}

    def read(slot: int) -> str:
        return f"x{slot}" if slot in produced else f"v[{slot}]"

    for index, step in enumerate(steps):
        args = ", ".join(read(slot) for slot in step.inputs)
        call = f"k{index}({args})"
        if step.memo is not None:  # the look-up StepMemo.run does, inline
            keyed = [f"id({read(step.inputs[position])})" for position in step.memo.varying]
            key = keyed[0] if len(keyed) == 1 else f"({', '.join(keyed)}{',' if keyed else ''})"
            call = f"(m{index}.get({key}) or (c{index}({args}),))[0]"
        named = [(position, slot) for position, slot in enumerate(step.outputs) if slot != SINK_SLOT]
        if not named:
            line = call
        elif len(named) == 1 and len(step.outputs) == 1:
            line = f"x{named[0][1]} = {call}[0]"
        else:
            line = "r = " + call + "".join(f"; x{slot} = r[{position}]" for position, slot in named) + "; del r"
        step_at_line[len(lines) + 2] = index  # line 1 is the `def`
        lines.append(line)
        released = [slot for slot in step.frees if slot in produced and slot != SINK_SLOT]
        if released:
            lines.append("del " + ", ".join(f"x{slot}" for slot in released))
    lines.extend(f"v[{slot}] = x{slot}" for slot in dict.fromkeys(outputs) if slot in produced)
    return lines, step_at_line
