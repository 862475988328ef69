"""Why a fused op was lost, said for a person and kept whole for machines: a fusion-regression's `cause`.

Four kinds of evidence, each said only when it says something:
  - the rule did not run at this commit (disabled, as `run --disable` or `disabled_optimizers` does);
  - rules that fired differently: the lost op's rule and the rules that produce its anchor
    (optimizer/levels.py RULE_DEPENDENCIES) — GeluFusion 2 → 0, FastGeluFusion 0 → 2;
  - the structural diff (structure.py), where both model files are stored: the subgraph that stands
    where the fused op stood, next to the one the baseline fused, and the first step where it departs;
  - near misses of those rules, in the order a person reads them (near_miss_order.py).
When none of them says anything, the text says what was looked at. `text` is the stable field
other tools quote (GitHub check summaries); the rest is the evidence in full.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from optimizer.levels import rule_dependencies
from service.adapters.engines import ENGINES, EngineError
from service.models import Result
from service.usecases import structure
from service.usecases.near_miss_order import readable
from service.usecases.repro import ReproError, cut, verified

log = logging.getLogger("fusionwatch.alerts")

NEAR_MISSES_IN_TEXT = 3


@dataclass(frozen=True)
class Files:
    """The stored model files of the two commits, where the service has them (server mode)."""

    current: Path | None
    baseline: Path | None


def short(op: str) -> str:
    return op.rsplit(".", 1)[-1]


def explain(op: str, rule: str | None, result: Result, baseline: Result, files: Files) -> tuple[dict[str, Any], dict[str, bytes]]:
    """(cause, repro models by side) for `op` lost between `baseline` and `result`."""
    rules = [rule, *rule_dependencies(rule)] if rule else []
    cause: dict[str, Any] = {"rule": rule, "depends_on": rules[1:], "looked_at": []}
    said: list[str] = []

    if rule and rule in (baseline.rules or {}) and (result.rules or {}) and rule not in result.rules:
        said.append(f"{rule} did not run at this commit (disabled); it fired {_fired(baseline, rule)} time(s) at the baseline.")
    cause["looked_at"].append("the rules each run ran")

    fired = [{"rule": name, "before": _fired(baseline, name), "after": _fired(result, name)} for name in rules
             if name in (result.rules or {}) and _fired(baseline, name) != _fired(result, name)]
    cause["rules_fired"] = fired
    if fired:
        said.append("Fired differently: " + "; ".join(f"{f['rule']} {f['before']} → {f['after']}" for f in fired) + ".")
    cause["looked_at"].append(f"how often {', '.join(rules) or 'its rules'} fired")

    repros: dict[str, bytes] = {}
    if files.current is not None and files.baseline is not None:
        structural, repros = _structure(op, result, baseline, files)
        cause["structure"] = structural
        if structural.get("text"):
            said.append(structural["text"])
        cause["looked_at"].append(structural.get("looked_at", "both models' graphs"))
    else:
        cause["structure"] = None
        cause["looked_at"].append("no structural diff: the model files were measured elsewhere and not stored")

    misses = [m for m in (result.near_misses or []) if m.get("rule") in rules]
    cause["near_misses"] = misses
    lines = readable(misses, rules)
    ours_kept = _ours_still_fires(rule, result, baseline)
    if ours_kept:
        # Another engine's loss, where our own rule fired as often as at the baseline: our near misses
        # are about other places (a FastGelu at the pooler's Tanh) and would read as this loss's why.
        said.append(f"fusionwatch's own optimizer still fires {rule} here ({ours_kept}): {result.engine}'s "
                    f"{rule} stopped where ours did not, so our near misses cannot say why.")
        lines = []
    cause["near_miss_lines"] = lines
    if misses and not ours_kept:
        listed = [line for line in lines if not line[:1].isdigit() and not line.startswith("and ")][:NEAR_MISSES_IN_TEXT]
        more = len(misses) - len(listed)
        said.append("Near misses: " + "; ".join(listed) + (f"; and {more} more" if more > 0 else "") + ".")
    cause["looked_at"].append(f"the near misses of {', '.join(rules) or 'its rules'} ({len(misses)} found)")

    if not said:
        said.append(f"Nothing found explains it; looked at {'; '.join(cause['looked_at'])}.")
    cause["text"] = " ".join(said)
    return cause, repros


def _ours_still_fires(rule: str | None, result: Result, baseline: Result) -> str | None:
    """"3 times, as at the baseline" where `result` is another engine's and our optimizer's view of the
    same model and level (its `rules`, measured with it) fired `rule` no less than at the baseline."""
    if not rule or result.engine == "fusionwatch" or rule not in (result.rules or {}):
        return None
    now, before = _fired(result, rule), _fired(baseline, rule)
    if now == 0 or now < before:
        return None
    return f"{now} time{'s' if now != 1 else ''}, as at the baseline" if now == before else f"{before} → {now} times"


def _fired(result: Result, rule: str) -> int:
    stats = (result.rules or {}).get(rule)
    return int(stats.get("fired", 0)) if isinstance(stats, dict) else 0


def _structure(op: str, result: Result, baseline: Result, files: Files) -> tuple[dict[str, Any], dict[str, bytes]]:
    # Rules the baseline ran and this commit did not: disabled for this commit's side, as it was measured.
    disabled = tuple(sorted(set(baseline.rules or {}) - set(result.rules))) if result.rules else ()
    # The engine that lost the op; ours where that one cannot write its graphs here (onnxruntime without
    # a model's custom-op library), since ours reads a custom op as a barrier and optimizes around it.
    failures = []
    for name in dict.fromkeys((result.engine, "fusionwatch")):
        try:
            before_optimized = ENGINES[name].optimized_graph(files.baseline, result.level)
            now_optimized = ENGINES[name].optimized_graph(files.current, result.level, disabled)
            break
        except EngineError as error:
            failures.append(f"{name}: {error}")
    else:
        return {"looked_at": f"the optimized graphs, which could not be written ({'; '.join(failures)})"}, {}
    places = structure.places_of(before_optimized, op)
    if not places:
        return {"looked_at": f"the baseline's optimized graph, which has no {short(op)} to locate"}, {}
    baseline_model = onnx.load(str(files.baseline))
    current_model = onnx.load(str(files.current))
    alike: dict[tuple[str, str], list[structure.Place]] = {}
    regions = {}
    for place in places:
        before, now = structure.region_at(baseline_model, place), structure.region_at(current_model, place)
        if before is None or now is None:
            continue
        regions[place.fused_node] = (before, now)
        alike.setdefault((before.words, now.words), []).append(place)
    if not alike:
        where = places[0].consumer or places[0].output
        return {"looked_at": f"where {short(op)} stood (before {where}), which this commit's graph does not have"}, {}
    (before_words, now_words), group = next(iter(alike.items()))
    place = group[0]
    before, now = regions[place.fused_node]
    runs_now = _runs_at(now_optimized, place)
    where = f"before {place.consumer}" if place.consumer else f"at {place.output}"
    count = f", {len(group)} of {len(places)} places alike" if len(places) > 1 else ""
    text = (f"Where {short(op)} stood ({where}{count}), {before.words} became {now.words}; "
            f"it departs at {structure.departure(before, now)}")
    if runs_now:
        text += f"; this commit's optimized graph runs {runs_now} there"
    text += "."
    structural = {
        "where": place.consumer or place.output, "places": len(places), "alike": len(group),
        "baseline": before_words, "now": now_words, "departs": structure.departure(before, now),
        "now_runs": runs_now, "text": text, "engine": name,
        "looked_at": f"both models' graphs where the fused op stood, as {name} optimizes them",
    }
    repros, structural["repro"] = _repros(op, name, result.level, baseline_model, current_model, before, now, disabled)
    return structural, repros


def _runs_at(optimized: onnx.ModelProto, place: structure.Place) -> str | None:
    """The op this commit's optimized graph feeds the same consumer with."""
    if place.consumer is None:
        return None
    producers = {out: node for node in optimized.graph.node for out in node.output}
    consumer = next((n for n in optimized.graph.node if n.name == place.consumer), None)
    if consumer is None or len(consumer.input) <= place.consumer_input:
        return None
    node = producers.get(consumer.input[place.consumer_input])
    if node is None:
        return None
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


def _repros(op, engine, level, baseline_model, current_model, before, now, disabled) -> tuple[dict[str, bytes], dict[str, Any]]:
    """Both sides' cuts, each verified by running `engine` on it; or the reason there is none."""
    try:
        commit_side = verified(engine, cut(current_model, now, "commit"), level, op, expect_fused=False,
                               disabled=disabled)
        baseline_side = verified(engine, cut(baseline_model, before, "baseline"), level, op, expect_fused=True)
    except (ReproError, EngineError) as error:
        return {}, {"error": str(error)}
    return ({"commit": commit_side.model, "baseline": baseline_side.model},
            {"engine": engine, "level": level, "op": op, "disabled": list(disabled),
             "commit_bytes": len(commit_side.model), "baseline_bytes": len(baseline_side.model),
             "commit_fused": commit_side.fused, "baseline_fused": baseline_side.fused})
