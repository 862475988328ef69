"""Change points over a series' history: E-divisive means with a permutation test.

The offline view beside the per-commit alerts (Matteson & James 2014, as Apache Otava and MongoDB
use it): the split of a stretch of history that maximizes the energy distance between the two sides,
kept when fewer than `p_value` of random reorderings of the stretch split as well, then the same on
each side. Long histories are cut into windows of `window` points that overlap by half (a step
between two windows is still inside one); points found twice are merged.

Windows are placed on the whole series, not on the stretch of it read (`first` is the series
position of the first value given), and each window's permutations come from a generator seeded by
its own start, so a window's result depends on its values only: once its commits are fixed it never
changes, and `WindowResults` keeps it. A new result then costs the last window or two, and reading
the last N commits of a longer series again costs the partial window at the front.

The series is the logarithm of each commit's p10 (the statistic `timing.decide` uses), so a 10%
step weighs the same at 1 ms and at 100 ms. Pure numbers in, indices out: `queries/history.py` maps
them to commits and compares them with the alerts.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

WINDOW = 50
P_VALUE = 0.001
PERMUTATIONS = 1999  # the smallest p a test can give is 1 / (PERMUTATIONS + 1) = 0.0005
MIN_SIDE = 3  # points on each side of a split
BATCH = 250  # permutations evaluated at once, at most
FIRST_BATCH = 16  # batches grow from this: a stretch with no step is usually told apart within the first


@dataclass(frozen=True)
class ChangePoint:
    index: int  # the first point of the new level
    p_value: float
    before: float  # median of the stretch before, in the input's units
    after: float


def change_points(
    values: list[float] | np.ndarray,
    window: int = WINDOW,
    p_value: float = P_VALUE,
    seed: int = 0,
    first: int = 0,
    results: WindowResults | None = None,
) -> list[ChangePoint]:
    """Change points of `values` (positive timings), in order; `first` is the position of values[0] in
    the whole series (windows are placed on that), `results` the windows already computed."""
    x = np.log(np.asarray(values, dtype=np.float64))
    n = len(x)
    found: dict[int, float] = {}
    for start, stop, window_seed in _windows(first, n, window, seed):
        splits = results.splits(x[start:stop], window_seed, p_value) if results is not None else None
        if splits is None:
            rng = np.random.default_rng(window_seed)
            splits = [(index - start, p) for index, p in _divide(x, start, stop, p_value, rng)]
            if results is not None:
                results.keep(x[start:stop], window_seed, p_value, splits)
        for offset, p in splits:
            index = start + offset
            near = [i for i in found if abs(i - index) <= 2]
            if near:
                keep = min([*near, index], key=lambda i: found.get(i, p))
                best = min(found.get(i, p) for i in [*near, index])
                for i in near:
                    del found[i]
                found[keep] = best
            else:
                found[index] = p
    points = sorted(found)
    result = []
    for k, index in enumerate(points):
        left = points[k - 1] if k else 0
        right = points[k + 1] if k + 1 < len(points) else n
        result.append(ChangePoint(index, found[index], float(np.exp(np.median(x[left:index]))),
                                  float(np.exp(np.median(x[index:right])))))
    return result


def _windows(first: int, n: int, window: int, seed: int) -> list[tuple[int, int, tuple[int, int]]]:
    """(start, stop, seed) of each window over values[0:n], whose series positions are first..first+n:
    windows start every window // 2 positions of the series and are cut to the values given; one
    starting within the last half window is left out (its points are inside the window before)."""
    half = max(1, window // 2)
    end = first + n
    spans = []
    for position in range(first - first % half, end - half, half):
        if position + window <= first:
            continue
        spans.append((max(position, first) - first, min(position + window, end) - first, (seed, position)))
    return spans or [(0, n, (seed, first))]


class WindowResults:
    """Each window's splits (offsets in the window, p-values), by the window's values, seed and p: a
    window's result depends on nothing else. Least recently used ones are dropped past `capacity`
    (a window's entry is a few dozen bytes: 20,000 windows cover 50 series of 10,000 commits).

    `splits` and `keep` are what `change_points` asks and tells; `keep` is told of windows it
    computed, `remember` of ones found elsewhere (the database: usecases/change_point_windows.py)."""

    def __init__(self, capacity: int = 20_000) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[str, list[tuple[int, float]]] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(values: np.ndarray, seed: tuple[int, int], p_value: float) -> str:
        """The hex SHA-256 of everything a window's splits depend on."""
        digest = hashlib.sha256(np.ascontiguousarray(values).tobytes())
        digest.update(repr((seed, p_value, PERMUTATIONS, MIN_SIDE)).encode())
        return digest.hexdigest()

    def splits(self, values: np.ndarray, seed: tuple[int, int], p_value: float) -> list[tuple[int, float]] | None:
        return self.splits_by_key(self.key(values, seed, p_value))

    def splits_by_key(self, key: str) -> list[tuple[int, float]] | None:
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
            return found

    def keep(self, values: np.ndarray, seed: tuple[int, int], p_value: float, splits: list[tuple[int, float]]) -> None:
        self.remember(self.key(values, seed, p_value), splits)

    def remember(self, key: str, splits: list[tuple[int, float]]) -> None:
        with self._lock:
            self._entries[key] = splits
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


def _divide(x: np.ndarray, start: int, stop: int, p_value: float, rng: np.random.Generator):
    if stop - start < 2 * MIN_SIDE:
        return
    segment = x[start:stop]
    distances = np.abs(segment[:, None] - segment[None, :])
    observed = best_split(distances[None])
    tau, q = int(observed[0][0]), float(observed[1][0])
    if q <= 0:
        return
    exceed, done, batch = 0, 0, FIRST_BATCH
    while done < PERMUTATIONS:
        count = min(batch, PERMUTATIONS - done)
        done, batch = done + count, min(BATCH, batch * 2)
        orders = rng.permuted(np.tile(np.arange(len(segment)), (count, 1)), axis=1)
        permuted = distances[orders[:, :, None], orders[:, None, :]]
        exceed += int((best_split(permuted)[1] >= q).sum())
        if (exceed + 1) / (PERMUTATIONS + 1) > p_value:
            return  # already not significant: stop early
    p = (exceed + 1) / (PERMUTATIONS + 1)
    yield start + tau, p
    yield from _divide(x, start, start + tau, p_value, rng)
    yield from _divide(x, start + tau, stop, p_value, rng)


def best_split(d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For a batch of distance matrices [B, n, n]: the split τ maximizing the energy statistic
    q(τ) = τ(n−τ)/n · (2·mean cross distance − mean left distance − mean right distance), and q there."""
    _, n, _ = d.shape
    upper = np.triu(d, 1)
    prefix = upper.cumsum(axis=1).cumsum(axis=2)
    tau = np.arange(MIN_SIDE, n - MIN_SIDE + 1)
    left = prefix[:, tau - 1, tau - 1]  # pairs i < k < τ
    rows = upper.sum(axis=2).cumsum(axis=1)[:, tau - 1]  # pairs with i < τ
    total = upper.sum(axis=(1, 2))[:, None]
    right = total - rows  # pairs τ ≤ i < k
    cross = rows - left
    m = n - tau
    energy = 2 * cross / (tau * m) - left / (tau * (tau - 1) / 2) - right / (m * (m - 1) / 2)
    q = tau * m / n * energy
    best = q.argmax(axis=1)
    return tau[best], q[np.arange(len(q)), best]
