"""Refused request bodies against a real server process: the server's peak memory above idle for each,
and how long a signed push listing 40,000 commits takes to answer.

A fresh SQLite database, `fusionwatch db upgrade`, then `fusionwatch serve`; the server process's peak
RSS (VmHWM, reset before each request through /proc/PID/clear_refs) minus its RSS just before. Bodies
go with a Content-Length, or chunked without one (the server must count while streaming).

    python -m bench.hostile_bodies [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

SECRET = "bench-secret"
MB = 1024**2
TARGET_MB = 100  # the bound on a refused body's cost


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "service.cli", *args]


def _rss_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} for process {pid}")


def _chunks(total: int, chunk: bytes, sent: list[int]) -> Iterator[bytes]:
    while sent[0] < total:
        sent[0] += len(chunk)
        yield chunk


def _signed(body: bytes) -> str:
    return "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()


def _push(commits: int) -> bytes:
    shas = [f"{i:040x}" for i in range(1, commits + 1)]
    return json.dumps({"ref": "refs/heads/main", "before": "0" * 40, "repository": {"name": "bench"},
                       "commits": [{"id": s} for s in shas], "head_commit": {"id": shas[-1]}}).encode()


def _cases() -> list[tuple[str, str, dict]]:
    """(name, path, httpx keyword arguments) for each refused body."""
    hundred = 100 * MB
    # Just under the 500,000 values parse_json allows (a ',' and a '{' each): the most objects a body may make.
    junk_results = b'{"project": "bench", "junk": [' + b"{}," * 249_990 + b"{}]}"
    floats = b'{"project": "bench", "junk": [' + b"1.5," * 499_990 + b"1.5]}"
    big_strings = json.dumps({"project": "bench", "commit": {"sha": "c1"}, "results": [
        {"model": "m.onnx", "engine": "fusionwatch", "engine_version": "1", "level": "all", "fusions": {},
         "near_misses": [{"rule": "R", "anchor": "a", "reason": "x" * MB}] * 7}]}).encode()
    deep = b"[" * 200_000 + b"]" * 200_000
    many_values = b'{"repository": {"name": "bench"}, "x": [' + b"[]," * 1_600_000 + b"[]]}"
    in_budget = b'{"repository": {"name": "bench"}, "x": [' + b"[]," * 249_990 + b"[]]}"
    upload_request = httpx.Request("POST", "http://bench", data={"payload": json.dumps({"project": "bench", "sha": "c1"})},
                                   files=[("files", ("big.onnx", b"\0" * (200 * MB), "application/octet-stream"))])
    upload, upload_type = upload_request.read(), upload_request.headers["content-type"]
    json_headers = {"content-type": "application/json", "X-GitHub-Event": "push", "X-GitHub-Delivery": "d"}
    return [
        ("github: 100 MB, Content-Length", "/webhooks/github", {"content": b" " * hundred}),
        ("github: 100 MB, chunked", "/webhooks/github", {"chunked": (hundred, b" " * MB)}),
        ("results: 100 MB, Content-Length", "/results", {"content": b" " * hundred}),
        ("results: 100 MB, chunked", "/results", {"chunked": (hundred, b" " * MB)}),
        ("ci: 100 MB JSON, chunked", "/webhooks/ci", {"chunked": (hundred, b" " * MB)}),
        ("ci: 200 MB signed upload, wrong signature", "/webhooks/ci",
         {"content": upload, "headers": {"content-type": upload_type, "X-Hub-Signature-256": "sha256=" + "0" * 64}}),
        ("github: 200,000 deep", "/webhooks/github", {"content": deep}),
        ("github: 1.6M values (4.8 MB)", "/webhooks/github", {"content": many_values}),
        ("github: 250k empty lists, bad signature", "/webhooks/github",
         {"content": in_budget, "headers": {**json_headers, "X-Hub-Signature-256": "sha256=" + "0" * 64}}),
        ("results: 250k empty objects", "/results", {"content": junk_results}),
        ("results: 500k floats", "/results", {"content": floats}),
        ("results: 7 MB of 1 MB strings", "/results", {"content": big_strings}),
    ], json_headers


def _send(http: httpx.Client, url: str, spec: dict, headers: dict) -> tuple[str, int]:
    """(the reply's status, or how the server ended the connection; bytes the client sent)."""
    sent = [0]
    kwargs = {"headers": spec.get("headers", headers), "timeout": 120}
    if "chunked" in spec:
        kwargs["content"] = _chunks(*spec["chunked"], sent)
    else:
        kwargs["content"] = spec["content"]
        sent[0] = len(spec["content"])
    try:
        reply = http.post(url, **kwargs)
        return f"{reply.status_code} {reply.json().get('detail', '')[:70]}", sent[0]
    except httpx.HTTPError as error:  # the server answered 413 and closed while the client was still sending
        return f"closed by the server ({type(error).__name__})", sent[0]


def run() -> dict:
    with tempfile.TemporaryDirectory(prefix="fw-bench-") as folder:
        env = os.environ | {"FUSIONWATCH_DATABASE_URL": f"sqlite:///{folder}/fw.db", "FUSIONWATCH_LOG_LEVEL": "WARNING"}
        subprocess.run(_command("db", "upgrade"), env=env, check=True, capture_output=True)
        token = subprocess.run(_command("token", "create", "bench"), env=env, check=True, capture_output=True,
                               text=True).stdout.strip()
        port = 18000 + os.getpid() % 1000
        server = subprocess.Popen(_command("serve", "--port", str(port), "--data-dir", f"{folder}/data"), env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}/api/v1"
        try:
            with httpx.Client(headers={"Authorization": f"Bearer {token}"}) as http:
                for _ in range(240):
                    try:
                        http.get(f"{base}/health", timeout=2)
                        break
                    except httpx.TransportError:
                        time.sleep(0.5)
                http.post(f"{base}/projects", json={"name": "bench", "kind": "engine", "webhook_secret": SECRET}).raise_for_status()
                model = subprocess.run([sys.executable, "-c", "import sys; from tests.hostile_models import many_nodes;"
                                        "sys.stdout.buffer.write(many_nodes(3).SerializeToString())"],
                                       capture_output=True, check=True).stdout
                http.post(f"{base}/projects/bench/models", files={"file": ("relu.onnx", model)}).raise_for_status()
                cases, headers = _cases()
                for _name, path, spec in cases[:2]:  # warm: the routes' first use imports and compiles
                    _send(http, base + path, spec, headers)
                rows = []
                for name, path, spec in cases:
                    Path(f"/proc/{server.pid}/clear_refs").write_text("5")
                    idle = _rss_kb(server.pid, "VmRSS")
                    started = time.perf_counter()
                    answer, sent = _send(http, base + path, spec, headers)
                    rows.append({"case": name, "answer": answer, "sent_mb": round(sent / MB, 1),
                                 "idle_mb": round(idle / 1024, 1),
                                 "peak_above_idle_mb": round((_rss_kb(server.pid, "VmHWM") - idle) / 1024, 1),
                                 "seconds": round(time.perf_counter() - started, 2)})
                push = _push(40_000)
                Path(f"/proc/{server.pid}/clear_refs").write_text("5")
                idle = _rss_kb(server.pid, "VmRSS")
                started = time.perf_counter()
                reply = http.post(f"{base}/webhooks/github", content=push, headers={
                    "content-type": "application/json", "X-GitHub-Event": "push", "X-GitHub-Delivery": "long",
                    "X-Hub-Signature-256": _signed(push)})
                rows.append({"case": f"github: signed push of 40,000 commits ({len(push) / MB:.1f} MB)",
                             "answer": f"{reply.status_code} {reply.json().get('status', reply.text[:60])}",
                             "sent_mb": round(len(push) / MB, 1), "idle_mb": round(idle / 1024, 1),
                             "peak_above_idle_mb": round((_rss_kb(server.pid, "VmHWM") - idle) / 1024, 1),
                             "seconds": round(time.perf_counter() - started, 2)})
        finally:
            server.terminate()
            server.wait(timeout=30)
    return {"cpu": _cpu(), "cores": os.cpu_count(), "load_1m": os.getloadavg()[0], "rows": rows}


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    report = run()
    if parser.parse_args().json:
        print(json.dumps(report, indent=2))
        return
    print(f"CPU {report['cpu']}, {report['cores']} cores, load {report['load_1m']:.1f}")
    print(f"{'case':44} {'answer':50} {'sent MB':>8} {'idle MB':>8} {'peak+ MB':>9} {'s':>6}")
    for row in report["rows"]:
        print(f"{row['case']:44} {row['answer'][:50]:50} {row['sent_mb']:8} {row['idle_mb']:8} "
              f"{row['peak_above_idle_mb']:9} {row['seconds']:6}")
    worst = max(r["peak_above_idle_mb"] for r in report["rows"])
    print(f"worst peak above idle: {worst} MB (target < {TARGET_MB} MB)")


if __name__ == "__main__":
    main()
