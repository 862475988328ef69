"""What this machine is, for the machine table: CPU model, cores, vector extensions, GPU, engine versions."""

from __future__ import annotations

import os
import platform
import socket
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

# The vector extensions that decide which kernels run; /proc/cpuinfo lists a hundred flags.
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile", "neon", "sve")


@cache
def describe_machine(machine_class: str = "cpu") -> dict:
    cpu, flags = platform.processor(), set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                cpu = value.strip()
            elif key.strip() in ("flags", "Features"):
                flags.update(value.split())
    return {
        "machine_class": machine_class,
        "hostname": socket.gethostname(),
        "cpu": cpu or platform.machine(),
        "cores": os.cpu_count() or 0,
        "isa": [f for f in ISA_FLAGS if f in flags],
        "gpu": "",
        "engine_versions": {name: _version(name) for name in ("fusionwatch", "onnxruntime", "onnx", "numpy")},
    }


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return ""


def limit_address_space(memory_mb: int = 0) -> int:
    """Cap this process's address space (a worker's: jobs run hostile models); returns the cap in bytes.
    0 means three quarters of the machine's physical memory."""
    import resource

    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = memory_mb * 1024**2 if memory_mb > 0 else physical * 3 // 4
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return limit
