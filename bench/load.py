"""`make bench-load`: the service under load, on loopback, for a bounded number of requests.

Starts `fusionwatch serve` on 127.0.0.1 (a fresh SQLite database in a temporary folder, or a schema
of its own on the PostgreSQL server --database-url / FUSIONWATCH_BENCH_DATABASE_URL names; --workers
API processes, by default as each is deployed: two on PostgreSQL, one on SQLite), with jobs sent to Celery on Redis (FUSIONWATCH_BENCH_REDIS_URL, default
redis://127.0.0.1:6379/0, a queue nobody consumes and that is purged afterwards), so the API is measured
alone rather than beside a worker measuring models on the same two cores. From this second process it
drives, with a fixed number of requests in flight and a write token:

  1. CI webhook posts (JSON, one new commit each, a run with one job): the target is >= 300 posts/s with
     p99 < 200 ms and no errors over 10,000 requests on a 2-core machine;
  2. model uploads (multipart, a small model, distinct bytes each);
  3. POST /results, one commit each, building a 10,000-commit series;
  4. history reads of that whole series: the first apart (it reads every point, and finds the
     change-point windows the results' arrival computed, all but the newest one or two:
     service/usecases/history_windows.py), then --reads reads again, then --new-results times a new
     result and the read after it (the last window or two computed again): the target is < 100 ms;
  5. the server restarted --restarts times, each fresh process reading the history once: the points
     and windows are read from the database (service/usecases/history_points.py,
     change_point_windows.py), not computed again.

Prints a table and writes bench/results/load.json with the machine's CPU and load average. Beside
req/s and latency it prints the server's CPU time per request, which moves less than req/s when
other work shares the machine's cores.

    python -m bench.load [--webhooks 10000] [--uploads 200] [--results 10000] [--reads 50] [--new-results 20]
                         [--restarts 5] [--concurrency 16] [--database-url postgresql+psycopg://postgres@127.0.0.1:5432/test]
                         [--workers 2 on PostgreSQL, 1 on SQLite] [--profile server.svg] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from onnx import TensorProto, helper

from bench.tokens import bench_token
from service.adapters.machine import describe_machine

RESULTS = Path(__file__).parent / "results"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _model(index: int) -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    bias = helper.make_tensor("b", TensorProto.FLOAT, [8], [float(index)] * 8)
    graph = helper.make_graph([helper.make_node("Add", ["x", "b"], ["y"])], "g", [x], [y], [bias])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) process `pid` and its children (uvicorn's workers) have used so far;
    None off Linux."""
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    stats: dict[int, tuple[int, float]] = {}  # pid -> (parent, CPU seconds)
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue  # gone meanwhile
        stats[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / ticks)
    if pid not in stats:
        return None
    total, family = 0.0, [pid]
    while family:
        current = family.pop()
        total += stats[current][1]
        family += [child for child, (parent, _) in stats.items() if parent == current]
    return total


@dataclass
class Reply:
    status_code: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")

    def json(self) -> Any:
        return json.loads(self.body)


class Connection:
    """One keep-alive HTTP/1.1 connection, requests one at a time. The load comes from this process
    on the server's own two cores, so it is driven this cheaply (a tenth of httpx's CPU time per
    request): what it spends is taken from the server under test."""

    def __init__(self, host: str, port: int, prefix: str, token: str) -> None:
        self.host, self.port, self.prefix, self.token = host, port, prefix, token
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: bytes = b"", content_type: str = "application/json") -> Reply:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = (f"{method} {self.prefix}{path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: {content_type}\r\n"
                f"Authorization: Bearer {self.token}\r\nContent-Length: {len(body)}\r\n\r\n")
        self.writer.write(head.encode() + body)
        status_line, *header_lines = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in header_lines if line)
        if "content-length" not in headers:
            raise ValueError(f"{method} {path}: reply without Content-Length ({status_line})")
        reply = Reply(int(status_line.split(" ", 2)[1]), await self.reader.readexactly(int(headers["content-length"])))
        if headers.get("connection") == "close":
            await self.close()
        return reply

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.reader = self.writer = None


def _multipart(name: str, content: bytes) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode() + content + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


async def _drive(count: int, concurrency: int, request, connect, server_pid: int) -> dict:
    """`count` calls of `request(connection, i)` with `concurrency` in flight, each on a connection
    of its own; latencies, errors, and the CPU time per request of the server and of this client (on
    a machine shared with other work, req/s moves with the neighbours' load; the server's CPU time
    per request is what its code costs)."""
    if not count:
        return None
    latencies: list[float] = []
    errors: list[str] = []
    next_index = 0

    async def worker() -> None:
        nonlocal next_index
        connection = connect()
        while next_index < count:
            index = next_index
            next_index += 1
            started = time.perf_counter()
            try:
                response = await request(connection, index)
                if response.status_code >= 400:
                    errors.append(f"{response.status_code}: {response.text[:200]}")
            except (OSError, ValueError, asyncio.IncompleteReadError) as error:
                errors.append(f"{type(error).__name__}: {error}")
                await connection.close()
            latencies.append((time.perf_counter() - started) * 1000)
        await connection.close()

    server_cpu, client_cpu = _cpu_seconds(server_pid), time.process_time()
    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    server_cpu = (_cpu_seconds(server_pid) - server_cpu) if server_cpu is not None else None
    client_cpu = time.process_time() - client_cpu
    return _summary(latencies, errors, elapsed, server_cpu, client_cpu)


def _summary(latencies: list[float], errors: list[str], elapsed_s: float, server_cpu_s: float | None,
             client_cpu_s: float) -> dict:
    ordered, count = sorted(latencies), len(latencies)
    return {
        "requests": count,
        "per_s": count / elapsed_s,
        "p50_ms": statistics.median(ordered),
        "p99_ms": ordered[min(count - 1, int(count * 0.99))],
        "server_cpu_ms": server_cpu_s / count * 1000 if server_cpu_s is not None else None,
        "client_cpu_ms": client_cpu_s / count * 1000,
        "errors": len(errors),
        "first_errors": errors[:3],
    }


async def _after_new_results(count: int, post, read, server_pid: int) -> dict | None:
    """`count` times: a new result (not timed), then the history read after it (timed, and its server
    CPU time alone)."""
    if not count:
        return None
    latencies, errors, server_cpu, client_cpu = [], [], 0.0, 0.0
    started = time.perf_counter()
    for i in range(count):
        posted = await post(i)
        if posted.status_code >= 400:
            raise SystemExit(f"posting a result failed: {posted.status_code} {posted.text[:300]}")
        cpu_before, client_before, began = _cpu_seconds(server_pid), time.process_time(), time.perf_counter()
        reply = await read()
        latencies.append((time.perf_counter() - began) * 1000)
        client_cpu += time.process_time() - client_before
        if cpu_before is not None:
            server_cpu += _cpu_seconds(server_pid) - cpu_before
        if reply.status_code >= 400:
            errors.append(f"{reply.status_code}: {reply.text[:200]}")
    # req/s here counts the posts' time too: it is not a read rate.
    return _summary(latencies, errors, time.perf_counter() - started, server_cpu if cpu_before is not None else None,
                    client_cpu)


def _read_history(connection: Connection, i: int):
    return connection.request("GET", "/projects/load/history?model=series.onnx&limit=10000")


async def _read_history_after_restart(port: int, token: str, server_pid: int) -> dict:
    """The series' history read once by a server started afresh on the same database: no change-point
    windows in its memory, so it reads the ones the first server stored (or computes them all)."""
    return await _drive(1, 1, _read_history, lambda: Connection("127.0.0.1", port, "/api/v1", token), server_pid)


async def _run(port: int, token: str, args, server_pid: int) -> dict:
    def connect() -> Connection:
        return Connection("127.0.0.1", port, "/api/v1", token)

    setup = connect()
    settings = {"levels": ["basic"], "engines": ["fusionwatch"], "runs": 1, "warmup": 0}
    for reply in (
        await setup.request("POST", "/projects", json.dumps({"name": "load", "kind": "engine", "settings": settings}).encode()),
        await setup.request("POST", "/projects/load/models", *_multipart("m.onnx", _model(0))),
    ):
        if reply.status_code >= 400:
            raise SystemExit(f"setting up the project failed: {reply.status_code} {reply.text[:300]}")
    await setup.close()  # uvicorn closes connections idle for 5 s

    def webhook(connection: Connection, i: int):
        payload = {"project": "load", "sha": f"w{i:08d}", "branch": "main", "parents": [f"w{i - 1:08d}"] if i else []}
        return connection.request("POST", "/webhooks/ci", json.dumps(payload).encode())

    def upload(connection: Connection, i: int):
        return connection.request("POST", "/projects/load/models", *_multipart(f"m{i % 20}.onnx", _model(i + 1)))

    def result(connection: Connection, i: int):
        document = {
            "project": "load",
            "commit": {"sha": f"r{i:08d}", "branch": "results", "parents": [f"r{i - 1:08d}"] if i else []},
            "results": [{"model": "series.onnx", "engine": "onnxruntime", "engine_version": "1.20.0",
                         "level": "all", "fusions": {"com.microsoft.BiasGelu": 2},
                         "execute_ms": [1.0 + (i % 7) * 0.01 for _ in range(10)]}],
        }
        return connection.request("POST", "/results", json.dumps(document).encode())

    report = {
        "webhooks": await _drive(args.webhooks, args.concurrency, webhook, connect, server_pid),
        "uploads": await _drive(args.uploads, args.concurrency, upload, connect, server_pid),
        "results": await _drive(args.results, args.concurrency, result, connect, server_pid),
    }
    if not args.results:
        return report
    # The first read computes the series' change points (E-divisive, permutation tests: seconds over
    # 10,000 commits); reads after it, with no new result in between, find them remembered.
    report["history_first_read"] = await _drive(1, 1, _read_history, connect, server_pid)
    check = await _read_history(setup, 0)
    if check.status_code >= 400:
        raise SystemExit(f"history read failed: {check.status_code} {check.text[:300]}")
    points = len(check.json()["series"][0]["points"])
    report["history_reads"] = await _drive(args.reads, 1, _read_history, connect, server_pid) | {"points": points}
    report["history_after_new_result"] = await _after_new_results(
        args.new_results, lambda i: result(setup, args.results + i), lambda: _read_history(setup, 0), server_pid)
    await setup.close()
    return report


def _postgresql_schema(server_url: str) -> tuple[str, str]:
    """A schema of its own on the PostgreSQL server (dropped afterwards): its URL and its name."""
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    schema = f"bench_load_{uuid.uuid4().hex[:12]}"
    admin = create_engine(server_url)
    with admin.begin() as connection:
        connection.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    admin.dispose()
    scoped = make_url(server_url).update_query_dict({"options": f"-csearch_path={schema}"})
    return scoped.render_as_string(hide_password=False), schema


def _drop_schema(server_url: str, schema: str) -> None:
    from sqlalchemy import create_engine

    admin = create_engine(server_url)
    with admin.begin() as connection:
        connection.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
    admin.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--webhooks", type=int, default=10_000)
    parser.add_argument("--uploads", type=int, default=200)
    parser.add_argument("--results", type=int, default=10_000)
    parser.add_argument("--reads", type=int, default=50)
    parser.add_argument("--new-results", type=int, default=20,
                        help="then this many times: one more result, and the history read after it")
    parser.add_argument("--restarts", type=int, default=5,
                        help="servers started afresh after the rest, each reading the history once")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--workers", type=int,
                        help="API processes (`fusionwatch serve --workers`); default as deployed: 2 on PostgreSQL "
                        "(docker-compose.yml's api), 1 on SQLite (`make run`, one writer)")
    parser.add_argument("--profile", type=Path, metavar="FILE",
                        help="run the server under py-spy (pip install py-spy) and write its flame graph here "
                        "(.svg), or its collapsed stacks (.txt)")
    parser.add_argument("--database-url", default=os.environ.get("FUSIONWATCH_BENCH_DATABASE_URL"),
                        help="a PostgreSQL server (postgresql+psycopg://...; the run gets a schema of its own, "
                        "dropped afterwards); default a fresh SQLite file")
    parser.add_argument("--keep", action="store_true",
                        help="keep the run's folder (its SQLite database, the server's log) and PostgreSQL schema, "
                        "and print where they are")
    args = parser.parse_args()
    if args.workers is None:
        args.workers = 2 if args.database_url else 1

    folder = Path(tempfile.mkdtemp(prefix="fusionwatch-load-"))
    schema = None
    if args.database_url:
        if not args.database_url.startswith("postgresql"):
            raise SystemExit(f"--database-url {args.database_url!r}: expected postgresql+psycopg://...")
        database, schema = _postgresql_schema(args.database_url)
    else:
        database = f"sqlite:///{folder / 'load.db'}"
    redis_url = os.environ.get("FUSIONWATCH_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    env = os.environ | {
        "FUSIONWATCH_DATABASE_URL": database,
        "FUSIONWATCH_DATA_DIR": str(folder / "data"),
        "FUSIONWATCH_BROKER_URL": redis_url,
        "FUSIONWATCH_MACHINE_CLASS": queue,
        "FUSIONWATCH_LOG_LEVEL": "WARNING",
    }
    fusionwatch = [sys.executable, "-m", "service.cli"]
    load_before = os.getloadavg()
    try:
        subprocess.run([*fusionwatch, "db", "upgrade"], env=env, check=True, capture_output=True)
        report = _serve_and_drive(fusionwatch, env, folder, bench_token(database, "bench-load", "write"), args)
    finally:
        import redis

        redis.Redis.from_url(redis_url).delete(queue)
        if schema is not None and not args.keep:
            _drop_schema(args.database_url, schema)
        if args.keep:
            print(f"kept {folder}" + (f" and schema {schema}" if schema else ""))
        else:
            shutil.rmtree(folder, ignore_errors=True)
    machine = describe_machine()
    load_after = os.getloadavg()
    report |= {"cpu": machine["cpu"], "cores": machine["cores"], "database": database.split(":")[0].split("+")[0],
               "concurrency": args.concurrency, "workers": args.workers, "python": platform.python_version(),
               "load_average_before": load_before, "load_average_after": load_after,
               "command": " ".join(["python -m bench.load", *sys.argv[1:]])}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "load.json").write_text(json.dumps(report, indent=2))
    print(f"{machine['cpu']}, {machine['cores']} cores; {report['database']}; {args.concurrency} requests in flight, "
          f"{args.workers} API process(es); "
          f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after")
    print(f"{'':26}{'requests':>9}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}{'server CPU ms/req':>19}"
          f"{'client CPU ms/req':>19}")
    for name in ("webhooks", "uploads", "results", "history_first_read", "history_reads", "history_after_new_result",
                 "history_after_restart"):
        row = report.get(name)
        if row is None:
            continue
        server_cpu = f"{row['server_cpu_ms']:.2f}" if row["server_cpu_ms"] is not None else "-"
        print(f"{name:26}{row['requests']:>9}{row['per_s']:>9.1f}{row['p50_ms']:>9.1f}{row['p99_ms']:>9.1f}"
              f"{row['errors']:>8}{server_cpu:>19}{row['client_cpu_ms']:>19.2f}")
        for error in row["first_errors"]:
            print(f"    {error}")
    points = report["history_reads"]["points"] if report.get("history_reads") else 0
    print(f"history reads return {points} points; targets: webhooks >= 300/s, "
          "p99 < 200 ms, 0 errors; history < 100 ms")
    for name, what in (("history_first_read", "first read of the series"),
                       ("history_after_restart", "first read after a restart (p50 over the restarts)")):
        if report.get(name):
            print(f"{what}: {report[name]['p50_ms']:.0f} ms ({report[name]['server_cpu_ms']:.0f} ms of server CPU)"
                  if report[name]["server_cpu_ms"] is not None else f"{what}: {report[name]['p50_ms']:.0f} ms")


def _serve_and_drive(fusionwatch: list[str], env: dict[str, str], folder: Path, token: str, args) -> dict:
    report = _serving(fusionwatch, env, folder, args.workers, args.profile,
                      lambda port, pid: _run(port, token, args, pid))
    if args.results and args.restarts:
        # Then restarts: the first history read of each fresh process, beside the first server's cold one
        # (one read's CPU time moves by tens of ms, so several processes are asked).
        reads = [_serving(fusionwatch, env, folder, args.workers, None,
                          lambda port, pid: _read_history_after_restart(port, token, pid)) for _ in range(args.restarts)]
        cpu = [read["server_cpu_ms"] for read in reads]
        report["history_after_restart"] = _summary(
            [read["p50_ms"] for read in reads], [e for read in reads for e in read["first_errors"]],
            sum(read["p50_ms"] for read in reads) / 1000, None if None in cpu else sum(cpu) / 1000,
            sum(read["client_cpu_ms"] for read in reads) / 1000)
    return report


def _serving(fusionwatch: list[str], env: dict[str, str], folder: Path, workers: int, profile: Path | None, drive):
    """`drive(port, server_pid)`'s report, run against `fusionwatch serve` started for it and stopped after."""
    port = _free_port()
    log = (folder / "serve.log").open("a")
    serve = [*fusionwatch, "serve", "--port", str(port), "--workers", str(workers)]
    if profile is not None:
        py_spy = shutil.which("py-spy", path=Path(sys.executable).parent) or "py-spy"
        output_format = "raw" if profile.suffix == ".txt" else "flamegraph"  # raw: collapsed stacks, one a line
        serve = [py_spy, "record", "--subprocesses", "--gil", "--nonblocking", "--rate", "250", "--format", output_format,
                 "-o", str(profile.resolve()), "--", *serve]
    server = subprocess.Popen(serve, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/api/v1"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{base}/health", timeout=2).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit(f"the service did not start:\n{(folder / 'serve.log').read_text()}") from None
                time.sleep(0.25)
        return asyncio.run(drive(port, server.pid))
    finally:
        # py-spy writes its flame graph on SIGINT, and passes it on to the server.
        server.send_signal(signal.SIGINT if profile is not None else signal.SIGTERM)
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
