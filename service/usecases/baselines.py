"""The baseline of a result: what it is compared with.

The nearest measured ancestor of the result's commit (breadth-first over parents, so another
branch's merge base counts), with the same fingerprint — same model, engine, level, machine class,
threads and inputs. When the walk finds none (a parentless commit, or parents CI never reported),
the latest earlier commit on the same branch, by timestamp or else arrival, stands in.

Both are a few indexed queries whatever the history's length: the walk reads one generation of
parents at a time and stops at the first measured one, so posting the 10,000th commit costs what
posting the 10th did.
"""

from __future__ import annotations

from sqlalchemy import Integer, bindparam, select, tuple_
from sqlalchemy.orm import Session, load_only

from service.models import Commit, Result

# A walk this deep without a measured ancestor gives up on ancestry (and falls back to branch order).
MAX_GENERATIONS = 1000


def find_baseline(session: Session, result: Result) -> Result | None:
    nearest = measured_ancestors(session, result, limit=1)
    return nearest[0] if nearest else None


def measured_ancestors(session: Session, result: Result, limit: int, timings_only: bool = False) -> list[Result]:
    """Up to `limit` results with this fingerprint on the commit's measured ancestors, nearest first (the
    latest result per commit); when no ancestor is measured, on earlier commits of the branch.
    `timings_only`: the ancestors' TIMING_COLUMNS are read, and any other column when first used."""
    commit = session.get(Commit, result.commit_id)
    return (_ancestry(session, result, commit, limit, timings_only)
            or _earlier_on_branch(session, result, commit, limit, timings_only))


# The walk's statements, built once: POST /results walks 100 measured ancestors for its timing window
# (service/usecases/timing_alerts.py), and building and compiling a statement per generation cost
# more than the database's work.
_COMMITS_NAMED = select(Commit.id, Commit.sha, Commit.parents).where(
    Commit.project_id == bindparam("project_id"), Commit.sha.in_(bindparam("shas", expanding=True)))
_EARLIER_ON_BRANCH = (
    select(Commit.id, Commit.sha, Commit.parents, Commit.seq)
    .where(Commit.project_id == bindparam("project_id"), Commit.branch == bindparam("branch"),
           Commit.seq < bindparam("seq"))
    .order_by(Commit.seq.desc())
    .limit(bindparam("count"))
)
# The same by (timestamp, arrival), from the index on (project_id, branch, timestamp, seq).
_EARLIER_BY_TIME = (
    select(Commit.id, Commit.timestamp, Commit.seq)
    .where(Commit.project_id == bindparam("project_id"), Commit.branch == bindparam("branch"),
           tuple_(Commit.timestamp, Commit.seq)
           < tuple_(bindparam("timestamp", type_=Commit.timestamp.type), bindparam("seq", type_=Integer())))
    .order_by(Commit.timestamp.desc(), Commit.seq.desc())
    .limit(bindparam("count"))
)
_MOST_A_PAGE = 4096  # commits a page of the branch asks results for (one IN list)
_MEASURED = (
    select(Result)
    .where(Result.fingerprint == bindparam("fingerprint"), Result.commit_id.in_(bindparam("commit_ids", expanding=True)),
           Result.id != bindparam("result_id"))
    .order_by(Result.id)
)
# What the timing window uses of each of its 100 ancestors (service/usecases/timing_alerts.py): decoding
# every result's JSON columns (near misses, rules, kernels, op counts) was a fifth of a POST /results.
TIMING_COLUMNS = (Result.id, Result.commit_id, Result.fingerprint, Result.execute_ms, Result.canary_ms,
                  Result.graph_hash, Result.engine_version, Result.kernel_libraries)
_MEASURED_TIMINGS = _MEASURED.options(load_only(*TIMING_COLUMNS))


def _measured(session: Session, result: Result, commit_ids: list[int], timings_only: bool = False) -> dict[int, Result]:
    """The latest result with this fingerprint at each of these commits."""
    rows = session.scalars(_MEASURED_TIMINGS if timings_only else _MEASURED,
                           {"fingerprint": result.fingerprint, "commit_ids": commit_ids,
                            "result_id": result.id or 0})  # 0: no row's id (a result not yet flushed)
    return {row.commit_id: row for row in rows}


class _Commits:
    """(id, parents) of the project's commits by sha, for the walk: read ahead once, as the commits
    that arrived on the branch just before the walk's start (on a branch's history, its nearest
    ancestors), and the rest by sha a generation at a time, as the walk meets them."""

    def __init__(self, session: Session, start: Commit, read_ahead: int) -> None:
        self.session, self.project_id = session, start.project_id
        rows = session.execute(_EARLIER_ON_BRANCH, {"project_id": start.project_id, "branch": start.branch,
                                                    "seq": start.seq, "count": read_ahead})
        self._known = {row.sha: (row.id, row.parents) for row in rows}

    def generation(self, shas: list[str]) -> list[tuple[int, str, list[str]]]:
        """(id, sha, parents) of those of `shas` that are the project's commits, in their order."""
        missing = [sha for sha in shas if sha not in self._known]
        if missing:
            for row in self.session.execute(_COMMITS_NAMED, {"project_id": self.project_id, "shas": missing}):
                self._known[row.sha] = (row.id, row.parents)
        return [(self._known[sha][0], sha, self._known[sha][1] or []) for sha in shas if sha in self._known]


def _ancestry(session: Session, result: Result, commit: Commit, limit: int, timings_only: bool) -> list[Result]:
    """Breadth-first over parents, a generation at a time, each in its parents' order. The results
    on the commits visited are asked for in batches (at least as many commits as results still
    wanted): the order found, and so the nearest `limit`, is the walk's whatever the batches."""
    commits = _Commits(session, commit, read_ahead=2 * limit)
    found: list[Result] = []
    visited: list[int] = []  # commits whose results are not asked for yet
    seen = {commit.sha}
    frontier = [sha for sha in dict.fromkeys(commit.parents or []) if sha not in seen]
    for _ in range(MAX_GENERATIONS):
        if not frontier:
            break
        seen.update(frontier)
        rows = commits.generation(frontier)
        visited += [commit_id for commit_id, _, _ in rows]
        frontier = list(dict.fromkeys(sha for _, _, parents in rows for sha in parents if sha not in seen))
        if visited and (len(visited) >= limit - len(found) or not frontier):
            measured = _measured(session, result, visited, timings_only)
            found += [measured[commit_id] for commit_id in visited if commit_id in measured]
            visited = []
            if len(found) >= limit:
                break
    if visited:  # the walk's last generations, when it stopped at MAX_GENERATIONS
        measured = _measured(session, result, visited, timings_only)
        found += [measured[commit_id] for commit_id in visited if commit_id in measured]
    return found[:limit]


def _earlier_on_branch(session: Session, result: Result, commit: Commit, limit: int, timings_only: bool) -> list[Result]:
    """By timestamp where this commit has one (ties by arrival; untimed commits are left out), else by
    arrival; the latest result per commit. On PostgreSQL this is the usual way for results posted at
    once for consecutive commits: a parent still being written by another request is not visible to
    the walk.

    The branch's earlier commits are read from its index a page at a time, newest first, and only
    their results are asked for. One query joining the fingerprint's results to the branch's commits
    read every result of the series: on PostgreSQL, with a young table's statistics, it became a
    nested loop over the series for each of its commits (1.2 s at 700 commits) and POST /results
    fell to 25 a second in bench.load."""
    query, params = _EARLIER_BY_TIME, {"timestamp": commit.timestamp, "seq": commit.seq}
    if commit.timestamp is None:
        query, params = _EARLIER_ON_BRANCH, {"seq": commit.seq}
    found: list[Result] = []
    count = limit + 3  # commits measured on every commit of a branch fill the window in one page
    while len(found) < limit:
        rows = session.execute(query, {"project_id": commit.project_id, "branch": commit.branch,
                                       "count": count, **params}).all()
        measured = _measured(session, result, [row.id for row in rows], timings_only) if rows else {}
        found += [measured[row.id] for row in rows if row.id in measured]
        if len(rows) < count:
            break
        last = rows[-1]  # the next page starts after it
        params = {"seq": last.seq} if commit.timestamp is None else {"timestamp": last.timestamp, "seq": last.seq}
        count = min(count * 2, _MOST_A_PAGE)
    return found[:limit]
