"""What the report says about the machine, the software and the checkout."""

from __future__ import annotations

import datetime as dt
import importlib.metadata as md
import os
import platform
import subprocess

from bench.common import ROOT

PACKAGES = ("llama_cpp_python", "onnxruntime", "numpy", "gguf", "torch", "transformers", "qwen-tts")
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


def _cpuinfo() -> dict:
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if ":" in line:
                    k, v = (x.strip() for x in line.split(":", 1))
                    info.setdefault(k, v)
    except OSError:
        pass
    return info


def _mem_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        return None
    return None


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:
        return ""


def describe() -> dict:
    cpu = _cpuinfo()
    flags = set(cpu.get("flags", "").split())
    versions = {}
    for p in PACKAGES:
        try:
            versions[p] = md.version(p)
        except md.PackageNotFoundError:
            versions[p] = None
    dirty = [line for line in _git("status", "--porcelain", "--untracked-files=no").splitlines() if line]
    try:
        load = open("/proc/loadavg").read().split()[:3]
    except OSError:
        load = []
    return {
        "cpu": cpu.get("model name", platform.processor()),
        "vendor": cpu.get("vendor_id"),
        "cores": os.cpu_count(),
        "flags": [f for f in FLAGS if f in flags],
        "hypervisor": "hypervisor" in flags,
        "l3_cache": cpu.get("cache size"),
        "ram_gib": _mem_gib(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "versions": versions,
        "commit": _git("rev-parse", "--short=12", "HEAD"),
        "commit_subject": _git("log", "-1", "--format=%s"),
        "dirty_files": len(dirty),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "loadavg_start": load,
    }


def block_origin() -> dict:
    """When and at which commit a block of the report was measured (report._block_origin names it)."""
    info = describe()
    return {"date": info["date"], "commit": info["commit"], "dirty_files": info["dirty_files"]}


def sched_autogroup() -> bool | None:
    """Whether the kernel shares the CPU between sessions before threads (CFS autogroup); None where
    that cannot be read."""
    try:
        return open("/proc/sys/kernel/sched_autogroup_enabled").read().strip() == "1"
    except OSError:
        return None


def loadavg() -> list[str]:
    try:
        return open("/proc/loadavg").read().split()[:3]
    except OSError:
        return []
