"""service/adapters/paired_measure.alternate on sides whose run times are known: new sessions settle
before blocks are sized or timed, and the sides are timed in pair order; an inconclusive job is timed
once more."""

from __future__ import annotations

from service.adapters.paired_measure import PairedTiming, alternate, kernels_side_by_side, with_second_try
from service.domain.paired import DEFAULT_PAIRED_POLICY, INCONCLUSIVE, REGRESSED, WITHIN_NOISE, PairedVerdict


class Machine:
    """A clock that advances by the runs it is asked to time."""

    def __init__(self) -> None:
        self.now = 0.0
        self.calls: list[str] = []

    def side(self, name: str, first_ms: float, settling_ms: float):
        """A session's runs: `first_ms` for its first, 1 ms + `settling_ms` for the next 24, then 1 ms."""
        done = [0]

        def block(runs: int) -> float:
            self.calls.append(name)
            times = []
            for _ in range(runs):
                i = done[0]
                done[0] += 1
                ms = first_ms if i == 0 else 1.0 + settling_ms if i < 25 else 1.0
                self.now += ms / 1000
                times.append(ms)
            return min(times)

        return block

    def clock(self) -> float:
        return self.now


def test_an_identical_model_whose_first_session_settles_slowly_is_within_noise():
    machine = Machine()
    # The first session of a process: a 200 ms first run, then runs of 2 ms settling to 1 ms;
    # the second session settles faster. Blocks sized on the first run held one run each, and the
    # still-settling side A made B look more than 5% faster for pairs on end ("improved").
    baseline = machine.side("A", first_ms=200.0, settling_ms=1.0)
    candidate = machine.side("B", first_ms=2.0, settling_ms=0.2)
    timing = alternate(baseline, candidate, 1, DEFAULT_PAIRED_POLICY, machine.clock)
    assert timing.block_runs == 50  # 50 ms blocks of the settled 1 ms run
    assert timing.verdict.word == WITHIN_NOISE and timing.verdict.ratio == 1.0
    assert timing.baseline_ms == timing.candidate_ms == [1.0] * 8
    assert timing.stopped == "decided after 8 pairs"
    timed = machine.calls[-16:]
    assert timed == ["A", "B", "B", "A"] * 4


def _timing(word: str, machine_s: float, stopped: str) -> PairedTiming:
    verdict = PairedVerdict(word, 1.0, 0.9, 1.1, 60, 0.99, 5.0)
    return PairedTiming(baseline_ms=[1.0], candidate_ms=[1.0], machine_s=machine_s, stopped=stopped, verdict=verdict)


def test_an_inconclusive_job_is_timed_once_more_and_the_second_try_decides():
    tries = iter([_timing(INCONCLUSIVE, 6.0, "the job's 60 pairs were measured"),
                  _timing(REGRESSED, 2.0, "regressed after 8 pairs, and again on the 8 pairs after")])
    timing = with_second_try(lambda: next(tries))
    assert timing.verdict.word == REGRESSED and timing.machine_s == 8.0
    assert timing.stopped == ("regressed after 8 pairs, and again on the 8 pairs after (a second try: the first "
                              "ended inconclusive, the job's 60 pairs were measured)")


def test_a_decided_job_is_timed_once():
    calls = []
    timing = with_second_try(lambda: calls.append(1) or _timing(WITHIN_NOISE, 1.0, "decided after 8 pairs"))
    assert calls == [1] and timing.stopped == "decided after 8 pairs"


def test_a_regressions_kernels_are_profiled_alternately_and_their_medians_kept():
    calls = []
    rounds = iter([  # A B, B A, A B: what each profiled session reported, slowest first
        [{"op": "MatMul", "ms": 1.0}, {"op": "LayerNormalization", "ms": 0.05}],
        [{"op": "MatMul", "ms": 1.1}, {"op": "SkipLayerNormalization", "ms": 0.27}],
        [{"op": "MatMul", "ms": 1.2}, {"op": "SkipLayerNormalization", "ms": 0.25}, {"op": "Cast", "ms": 0.01}],
        [{"op": "MatMul", "ms": 0.9}, {"op": "LayerNormalization", "ms": 0.04}],
        [{"op": "MatMul", "ms": 1.3}, {"op": "LayerNormalization", "ms": 0.06}],
        [{"op": "MatMul", "ms": 1.0}, {"op": "SkipLayerNormalization", "ms": 0.29}],
    ])

    def profiled(path):
        calls.append(path)
        return next(rounds)

    kernels = kernels_side_by_side(profiled, "a.onnx", "b.onnx")
    assert calls == ["a.onnx", "b.onnx", "b.onnx", "a.onnx", "a.onnx", "b.onnx"]
    assert kernels["baseline"] == [{"op": "MatMul", "ms": 1.0}, {"op": "LayerNormalization", "ms": 0.05}]
    # Cast made one of three rounds' lists: a median of one round is left out.
    assert kernels["candidate"] == [{"op": "MatMul", "ms": 1.1}, {"op": "SkipLayerNormalization", "ms": 0.27}]
