"""`python -m bench.fusion_verdict`: seconds from upload to a BERT-base commit's fusion verdict.

A commit's fused-op counts need only the optimizer (the worker counts every job of a run before it
times any: service/commands/count_run_fusions.py); its timings take minutes. This exports BERT-base
(BertConfig()'s sizes, random weights, nothing downloaded) with the TorchScript exporter at opset 17
twice: commit A as is, commit B with its MLP's GELU rewritten as x·sigmoid(1.702x) (`quick_gelu`, which
BiasGelu cannot take). It serves fusionwatch as `make run` does (SQLite in a temporary folder, the
embedded worker), creates a project with the default engines and levels (both engines, every level:
8 jobs a commit; few timed runs and no pairing, so that A's timings end in a few minutes), submits A
and waits for its run to end, then submits B as a CI step would and prints the seconds from the start
of B's upload to `GET /runs/{id}` answering its fusion verdict, and that verdict; then the seconds to
the whole run's verdict are not waited for.

Needs torch and transformers (`make install-export`), about 3 GB of memory and 5 minutes.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from service.adapters.machine import describe_machine

BERT_BASE = {"layers": 12, "hidden": 768, "heads": 12, "intermediate": 3072, "vocab": 30522}  # BertConfig()'s
SETTINGS = {"runs": 5, "warmup": 1, "paired_max_seconds": 0, "sequence_length": 128}
FUSIONWATCH = Path(sys.executable).with_name("fusionwatch")


def main() -> None:
    from tools.make_fixtures import export_hf  # torch and transformers: only this script needs them

    with tempfile.TemporaryDirectory(prefix="fusion-verdict-") as tmp:
        folder = Path(tmp)
        exports = {}
        for commit, act in (("A", None), ("B", "quick_gelu")):
            exports[commit] = export_hf("bert", "torchscript", folder / f"bert_base_{commit}.onnx", seq=128, opset=17,
                                        verify=False, hidden_act=act, **BERT_BASE)
            print(f"exported commit {commit} ({exports[commit].stat().st_size / 1e6:.0f} MB)", flush=True)
        env = os.environ | {"FUSIONWATCH_DATABASE_URL": f"sqlite:///{folder / 'fusionwatch.db'}",
                            "FUSIONWATCH_DATA_DIR": str(folder / "data"), "FUSIONWATCH_LOG_LEVEL": "WARNING"}
        subprocess.run([str(FUSIONWATCH), "db", "upgrade"], env=env, check=True, capture_output=True)
        token = subprocess.run([str(FUSIONWATCH), "token", "create", "bench"], env=env, check=True, capture_output=True,
                               text=True).stdout.strip().split()[-1]
        port = _free_port()
        with open(folder / "server.log", "w") as log:
            server = subprocess.Popen([str(FUSIONWATCH), "serve", "--port", str(port)], env=env, stdout=log,
                                      stderr=subprocess.STDOUT)
        try:
            api = httpx.Client(base_url=f"http://127.0.0.1:{port}/api/v1", timeout=600,
                               headers={"Authorization": f"Bearer {token}"})
            _until(lambda: _up(api), 120)
            created = api.post("/projects", json={"name": "bert-base", "settings": SETTINGS})
            created.raise_for_status()
            a = _submit(api, "a" * 40, [], exports["A"])
            a_counted = _until(lambda: _fusions_done(api, a["run_url"]), 600)
            print(f"commit A: fusion verdict {a_counted['fusions']['verdict']} (no baseline yet), "
                  f"{a_counted['jobs_total']} jobs; waiting for A's timings to end", flush=True)
            _until(lambda: _ended(api, a["run_url"]), 1800)
            started = time.perf_counter()
            b = _submit(api, "b" * 40, ["a" * 40], exports["B"])
            uploaded = time.perf_counter() - started
            run = _until(lambda: _fusions_done(api, b["run_url"]), 600, poll_s=0.1)
            seconds = time.perf_counter() - started
        finally:
            server.terminate()
            server.wait(timeout=60)
    lost = sorted({(e["op"].rsplit(".", 1)[-1], e["before"], e["after"]) for e in run["fusions"]["lost"]})
    machine = describe_machine()
    print(f"CPU: {machine['cpu']} ({', '.join(machine['isa']) or 'no ISA extensions read'}); {machine['cores']} cores")
    print(f"BERT-base commit B ({run['jobs_total']} jobs: both engines, every level): fusion verdict "
          f"{run['fusions']['verdict']} in {seconds:.1f} s after the upload started (the upload itself "
          f"{uploaded:.1f} s); lost: {', '.join(f'{op} {x} → {y}' for op, x, y in lost) or 'nothing'}; "
          f"jobs timed by then: {run['jobs_done']} (target: ≤ 15 s)")


def _submit(api: httpx.Client, sha: str, parents: list[str], path: Path) -> dict:
    payload = {"project": "bert-base", "sha": sha, "branch": "main", "parents": parents, "message": path.stem}
    with path.open("rb") as handle:
        answer = api.post("/webhooks/ci", data={"payload": json.dumps(payload)},
                          files=[("files", ("bert.onnx", handle, "application/octet-stream"))])
    answer.raise_for_status()
    return answer.json()


def _fusions_done(api: httpx.Client, run_url: str) -> dict | None:
    run = api.get(run_url.removeprefix("/api/v1")).json()
    return run if run["fusions"]["done"] or run["state"] != "running" else None


def _ended(api: httpx.Client, run_url: str) -> dict | None:
    run = api.get(run_url.removeprefix("/api/v1")).json()
    return run if run["state"] != "running" else None


def _up(api: httpx.Client) -> bool:
    try:
        return api.get("/projects").status_code == 200
    except httpx.TransportError:
        return False


def _until(check, timeout_s: float, poll_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(poll_s)
    raise TimeoutError(f"not done after {timeout_s:g} s")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


if __name__ == "__main__":
    main()
