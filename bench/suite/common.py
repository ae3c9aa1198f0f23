"""Shared pieces of the benchmark suite: machine and version facts, statistics, the section record.

Every figure the suite writes sits in one JSON report whose top-level ``machine``, ``versions``
and ``model`` blocks describe the run; each section also names the model, quantisation and
backend it measured. Absolute numbers from a shared 2-core box are noise-prone: the sections
report RATIOS against a baseline measured in the same run, interleaved with the measured path.
"""

from __future__ import annotations

import importlib.metadata
import math
import os
import platform
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = "skulk-bench/1"

#: Third-party distributions whose versions shape the figures (every installed skulk-* is added).
THIRD_PARTY = (
    "xllamacpp",
    "llama-cpp-python",
    "msgpack",
    "pydantic",
    "httpx",
    "httpcore",
    "uvicorn",
    "fastapi",
    "starlette",
    "eclipse-zenoh",
    "zstandard",
    "numpy",
    "matplotlib",
    "pluggy",
)


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemAvailable"):
                out[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError):
        pass
    return out


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def machine_info() -> dict[str, Any]:
    mem = _meminfo()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 0
    return {
        "hostname": socket.gethostname(),
        "os": platform.platform(),
        "arch": platform.machine(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count() or 0,
        "cpu_usable": usable,
        "memory_total_bytes": mem.get("MemTotal", 0),
        "memory_available_bytes": mem.get("MemAvailable", 0),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "load_average": load_average(),
        "sched_autogroup": _read_int("/proc/sys/kernel/sched_autogroup_enabled"),
    }


def _read_int(path: str) -> int | None:
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None


def package_versions() -> dict[str, str]:
    versions: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name.startswith("skulk-") or name == "skulk":
            versions[name] = dist.version
    for name in THIRD_PARTY:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return dict(sorted(versions.items()))


def git_info() -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=20).stdout.strip()

    try:
        return {
            "commit": git("rev-parse", "HEAD") or None,
            "dirty_files": len([ln for ln in git("status", "--porcelain").splitlines() if ln.strip()]),
        }
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty_files": None}


# -- statistics -------------------------------------------------------------------------------------


def percentile(values: Iterable[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in [0, 100]); None for no values."""
    data = sorted(v for v in values if v is not None and not math.isnan(v))
    if not data:
        return None
    if len(data) == 1:
        return data[0]
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def summarize(values: Iterable[float], digits: int = 3) -> dict[str, Any]:
    data = [v for v in values if v is not None]
    if not data:
        return {"n": 0, "mean": None, "p50": None, "p90": None, "p99": None, "min": None, "max": None}

    def r(x: float | None) -> float | None:
        return None if x is None else round(x, digits)

    return {
        "n": len(data),
        "mean": r(sum(data) / len(data)),
        "p50": r(percentile(data, 50)),
        "p90": r(percentile(data, 90)),
        "p99": r(percentile(data, 99)),
        "min": r(min(data)),
        "max": r(max(data)),
    }


def ratio(value: float | None, baseline: float | None, digits: int = 4) -> float | None:
    if value is None or baseline is None or baseline == 0:
        return None
    return round(value / baseline, digits)


# -- the record of one section ----------------------------------------------------------------------


@dataclass
class Section:
    """One section of the report. ``ratios`` entries: {value, baseline, goal, met}."""

    name: str
    title: str
    status: str = "ok"  # ok | skipped | error
    reason: str | None = None
    context: dict[str, Any] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)
    ratios: dict[str, dict[str, Any]] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    duration_s: float = 0.0

    def skip(self, reason: str) -> Section:
        self.status, self.reason = "skipped", reason
        return self

    def add_ratio(
        self,
        key: str,
        value: float | None,
        baseline: str,
        *,
        goal: str | None = None,
        met: bool | None = None,
        note: str | None = None,
    ) -> None:
        entry: dict[str, Any] = {
            "value": value,
            "baseline": baseline,
            "goal": goal,
            "met": met if value is not None else None,
        }
        if note:
            entry["note"] = note
        self.ratios[key] = entry

    def row(
        self,
        metric: str,
        value: Any,
        unit: str = "",
        *,
        baseline: Any = None,
        ratio: Any = None,
        goal: str | None = None,
    ) -> None:
        self.rows.append(
            {"metric": metric, "value": value, "unit": unit, "baseline": baseline, "ratio": ratio, "goal": goal}
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "status": self.status,
            "reason": self.reason,
            "duration_s": round(self.duration_s, 2),
            "context": self.context,
            "results": self.results,
            "ratios": self.ratios,
            "rows": self.rows,
        }


def run_section(section: Section, body: Callable[[Section], None], log: Callable[[str], None]) -> Section:
    """Run one section; an exception marks it `error` (with the traceback tail) instead of ending the run."""
    started = time.perf_counter()
    log(f"== {section.name}: {section.title}")
    try:
        body(section)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # a failing section must not lose the others' figures
        section.status = "error"
        section.reason = f"{type(exc).__name__}: {exc}"[:2000]
        section.results.setdefault("traceback", traceback.format_exc()[-4000:])
        log(f"   error: {section.reason.splitlines()[0] if section.reason else ''}")
    section.duration_s = time.perf_counter() - started
    if section.status == "skipped":
        log(f"   skipped: {section.reason}")
    else:
        log(f"   {section.status} in {section.duration_s:.1f} s")
    return section


_T0 = time.monotonic()


def log(message: str) -> None:
    print(f"[{time.monotonic() - _T0:6.1f}s] {message}", file=sys.stderr, flush=True)
