"""`make bench-load`: the service under load, on loopback, for a bounded number of requests.

Starts `fusionwatch serve` on 127.0.0.1 (a fresh SQLite database in a temporary folder, or
FUSIONWATCH_BENCH_DATABASE_URL), with jobs sent to Celery on Redis (FUSIONWATCH_BENCH_REDIS_URL, default
redis://127.0.0.1:6379/0, a queue nobody consumes and that is purged afterwards), so the API is measured
alone rather than beside a worker measuring models on the same two cores. From this second process it
drives, with a fixed number of requests in flight:

  1. CI webhook posts (JSON, one new commit each, a run with one job): the target is >= 300 posts/s with
     p99 < 200 ms and no errors over 10,000 requests on a 2-core machine;
  2. model uploads (multipart, a small model, distinct bytes each);
  3. POST /results, one commit each, building a 10,000-commit series;
  4. history reads of that whole series: the target is < 100 ms.

Prints a table and writes bench/results/load.json with the machine's CPU.

    python -m bench.load [--webhooks 10000] [--uploads 200] [--results 10000] [--reads 50] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
from onnx import TensorProto, helper

from service.machine import describe_machine

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


async def _drive(count: int, concurrency: int, request) -> dict:
    """`count` calls of `request(i)` with `concurrency` in flight; latencies and errors."""
    latencies: list[float] = []
    errors: list[str] = []
    next_index = 0

    async def worker() -> None:
        nonlocal next_index
        while next_index < count:
            index = next_index
            next_index += 1
            started = time.perf_counter()
            try:
                response = await request(index)
                if response.status_code >= 400:
                    errors.append(f"{response.status_code}: {response.text[:200]}")
            except httpx.HTTPError as error:
                errors.append(f"{type(error).__name__}: {error}")
            latencies.append((time.perf_counter() - started) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    ordered = sorted(latencies)
    return {
        "requests": count,
        "per_s": count / elapsed,
        "p50_ms": statistics.median(ordered),
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        "errors": len(errors),
        "first_errors": errors[:3],
    }


async def _run(base: str, args) -> dict:
    limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)
    async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client:
        settings = {"levels": ["basic"], "engines": ["fusionwatch"], "runs": 1, "warmup": 0}
        (await client.post("/projects", json={"name": "load", "settings": settings})).raise_for_status()
        first = await client.post("/projects/load/models", files={"file": ("m.onnx", _model(0))})
        first.raise_for_status()

        def webhook(i: int):
            payload = {"project": "load", "sha": f"w{i:08d}", "branch": "main", "parents": [f"w{i - 1:08d}"] if i else []}
            return client.post("/webhooks/ci", json=payload)

        def upload(i: int):
            return client.post("/projects/load/models", files={"file": (f"m{i % 20}.onnx", _model(i + 1))})

        def result(i: int):
            document = {
                "project": "load",
                "commit": {"sha": f"r{i:08d}", "branch": "results", "parents": [f"r{i - 1:08d}"] if i else []},
                "results": [{"model": "series.onnx", "engine": "onnxruntime", "engine_version": "1.20.0",
                             "level": "all", "fusions": {"com.microsoft.BiasGelu": 2},
                             "execute_ms": [1.0 + (i % 7) * 0.01 for _ in range(10)]}],
            }
            return client.post("/results", json=document)

        def history(i: int):
            return client.get("/projects/load/history", params={"model": "series.onnx", "limit": 10_000})

        report = {
            "webhooks": await _drive(args.webhooks, args.concurrency, webhook),
            "uploads": await _drive(args.uploads, args.concurrency, upload),
            "results": await _drive(args.results, args.concurrency, result),
        }
        check = await history(0)
        points = len(check.json()["series"][0]["points"])
        report["history_reads"] = await _drive(args.reads, 1, history) | {"points": points}
        return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--webhooks", type=int, default=10_000)
    parser.add_argument("--uploads", type=int, default=200)
    parser.add_argument("--results", type=int, default=10_000)
    parser.add_argument("--reads", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="fusionwatch-load-"))
    database = os.environ.get("FUSIONWATCH_BENCH_DATABASE_URL", f"sqlite:///{folder / 'load.db'}")
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
    subprocess.run([*fusionwatch, "db", "upgrade"], env=env, check=True, capture_output=True)
    port = _free_port()
    log = (folder / "serve.log").open("w")
    server = subprocess.Popen([*fusionwatch, "serve", "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT)
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
        report = asyncio.run(_run(base, args))
    finally:
        server.terminate()
        server.wait(timeout=30)
        import redis

        redis.Redis.from_url(redis_url).delete(queue)
    machine = describe_machine()
    report |= {"cpu": machine["cpu"], "cores": machine["cores"], "database": database.split(":")[0],
               "concurrency": args.concurrency, "python": platform.python_version()}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "load.json").write_text(json.dumps(report, indent=2))
    print(f"{machine['cpu']}, {machine['cores']} cores; {report['database']}; {args.concurrency} requests in flight")
    print(f"{'':16}{'requests':>9}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}")
    for name in ("webhooks", "uploads", "results", "history_reads"):
        row = report[name]
        print(f"{name:16}{row['requests']:>9}{row['per_s']:>9.1f}{row['p50_ms']:>9.1f}{row['p99_ms']:>9.1f}{row['errors']:>8}")
        for error in row["first_errors"]:
            print(f"    {error}")
    print(f"history reads return {report['history_reads']['points']} points; targets: webhooks >= 300/s, "
          "p99 < 200 ms, 0 errors; history < 100 ms")


if __name__ == "__main__":
    main()
