"""The noise captures `make bench-detect` reports on, each as it was taken, and the table it prints.

An explicit list, not a glob over bench/data: a capture joins the table when someone says how it was
taken, and the held-out one is marked here before anyone looks at its numbers. Nothing in the
detection rules is tuned on any of them by this bench: it replays each one and counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"

# The paired captures of session 29 were taken when PairedPolicy.max_block_runs was 20: the tiny
# fixtures' runs take 0.1-0.3 ms, so their blocks were 20 runs, 3-6 ms, not the 50 ms the service's
# blocks fill since (up to 200 runs, commit 8a447c4). The replay decides on the blocks as recorded.


@dataclass(frozen=True)
class Capture:
    label: str
    unpaired: str | None  # bench/data file written by bench.detect_measure
    paired: str | None  # bench/data file written by bench.paired_capture
    how: str  # session, CPU, time, load: what the files' meta does not say
    held_out: bool = False  # taken after the rules were frozen; reported, never tuned on


CAPTURES = (
    Capture("xeon", "detect_noise.npz", None,
            "session 4, 2-core Intel Xeon (Sapphire Rapids class) VM, 2026-11-24 07:35-07:45 UTC, load 4.9-7.9; "
            "before session 6's profiler change"),
    Capture("zen5", "detect_noise_zen5.npz", None,
            "session 6, 2-core AMD EPYC (Zen 5, family 26) VM, 2026-11-24 14:27-14:37 UTC, load 0.9-3.2"),
    Capture("epyc1", "detect_noise_epyc1.npz", "paired_noise_epyc1.npz",
            "session 29, 2-core AMD EPYC VM ('AMD EPYC' in /proc/cpuinfo, family 25 model 17), 2026-11-28 UTC: "
            "unpaired 19:01:38-19:04:41, paired 19:04:50-19:08:52 (32 pairs a job); the lead's tests running"),
    Capture("epyc2", "detect_noise_epyc2.npz", "paired_noise_epyc2.npz",
            "session 29, the same VM half an hour later, after the bench's rules were frozen: "
            "unpaired 19:33:32-19:36:33, paired 19:36:36-19:40:39 (60 pairs a job)"),
    Capture("epyc3", "detect_noise_epyc3.npz", "paired_noise_epyc3.npz",
            "session 29, the same VM 20 minutes after epyc2, the bench's rules frozen before epyc2: "
            "unpaired 19:53:40-19:56:41, paired 19:56:43-20:00:44 (60 pairs a job)", held_out=True),
    Capture("epyc4", "detect_noise_epyc4.npz", "paired_noise_epyc4.npz",
            "session 13 (another session, another VM of the same CPU kind: 'AMD EPYC', family 25 model 17), "
            "2026-11-28 UTC, unpaired 22:09:39-22:12:39, paired 22:12:41-22:16:43, taken after the unpaired path's null-chance rule (8dd1549) and the "
            "paired path's settling (382e6ff) were committed (60 pairs a job, blocks of 50 ms "
            "after settling); no tests running", held_out=True),
    Capture("epyc5", "detect_noise_epyc5.npz", "paired_noise_epyc5.npz",
            "session 14 (another VM of the same CPU kind: 'AMD EPYC', family 25 model 17), 2026-11-29 UTC, "
            "unpaired 00:12:58-00:16:02, paired 00:16:05-00:24:09, taken after the machine's count in the unpaired "
            "path's null chance (f718829) was committed (60 pairs a job, blocks of 50 ms after settling); "
            "another engineer's executor benchmarks and tests running", held_out=True),
    Capture("zen5b", "detect_noise_zen5b.npz", "paired_noise_zen5b.npz",
            "session 15, 2-core AMD EPYC VM (family 26 model 2, Zen 5: the first paired capture of another CPU kind), "
            "2026-11-29 UTC, unpaired 02:53:02-02:56:04, paired 02:56:12-03:00:37, with the rules of 5f70054 "
            "(60 pairs a job, blocks of 50 ms after settling); the paired path's replicated regression (b0276f9) "
            "was written on epyc1 and epyc2 after it was taken and before it was replayed; another engineer's "
            "optimizer work and the lead's paired tests running", held_out=True),
    Capture("zen5c", "detect_noise_zen5c.npz", "paired_noise_zen5c.npz",
            "session 15, the same VM as zen5b (family 26 model 2), 2026-11-29 UTC, unpaired 03:04:53-03:07:54, "
            "paired 03:07:58-03:12:05, taken after the paired path's replicated regression and second try "
            "(b0276f9) were committed: the held-out capture of the rules as they stand; make bench-detect "
            "and another engineer's optimizer benchmarks running", held_out=True),
    Capture("zen5d", "detect_noise_zen5d.npz", "paired_noise_zen5d.npz",
            "session 15, the same VM as zen5b (family 26 model 2), 2026-11-29 UTC, unpaired 04:43:02-04:46:04, "
            "paired 04:46:06-04:50:07, with the session's code final (8b624d0): the paired path's check frozen since "
            "b0276f9, the unpaired rules since f718829; nothing else running", held_out=True),
    Capture("epyc6", "detect_noise_epyc6.npz", "paired_noise_epyc6.npz",
            "session 16 (another VM of the same CPU kind as epyc1-5: 'AMD EPYC', family 25 model 17), 2026-11-29 UTC, "
            "unpaired 06:20:16-06:23:17, paired 06:23:19-06:27:38, taken after the unpaired path's calm "
            "confirmations (56f8aa5) were committed: the held-out capture of the rules as they stand; another "
            "engineer's service work (feeds) running", held_out=True),
)


def named(labels: list[str] | None) -> list[Capture]:
    if not labels:
        return [c for c in CAPTURES if (c.unpaired is None or (DATA / c.unpaired).is_file())
                and (c.paired is None or (DATA / c.paired).is_file())]
    known = {c.label: c for c in CAPTURES}
    missing = [label for label in labels if label not in known]
    if missing:
        raise SystemExit(f"unknown capture(s) {missing}: known are {list(known)}")
    return [known[label] for label in labels]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def print_table(rows: list[tuple[Capture, dict | None, dict | None, str]]) -> None:
    """rows: (capture, unpaired figures, paired figures, load) with a 'pooled' row as a Capture too.
    Figures: false_per_1000, false_alarms, series_commits, big_caught, big_steps (+ paired's extras)."""
    print("| capture | load (1 min) | unpaired: false alarms / 1,000 | unpaired: steps ≥ 10% within 2 | "
          "paired: false alarms / 1,000 | paired: steps ≥ 10% caught | paired: nulls inconclusive | "
          "paired: median pairs, machine s to a decision |")
    print("|---|---|---|---|---|---|---|---|")
    for capture, unpaired, paired_, load in rows:
        name = f"**{capture.label} (held out)**" if capture.held_out else capture.label
        cells = [name, load]
        for figures in (unpaired, paired_):
            if figures is None:
                cells += ["-", "-"]
                continue
            cells.append(f"{figures['false_per_1000']:.2f} ({figures['false_alarms']} in {figures['series_commits']:,})")
            cells.append(f"{_pct(figures['big_caught'] / figures['big_steps'])} ({figures['big_caught']} of {figures['big_steps']})")
        if paired_ is None:
            cells += ["-", "-"]
        else:
            cells.append(_pct(paired_["null_inconclusive"]))
            cells.append(f"{paired_['median_pairs']:g}, {paired_['median_seconds']:.2f} s")
        print("| " + " | ".join(cells) + " |")
