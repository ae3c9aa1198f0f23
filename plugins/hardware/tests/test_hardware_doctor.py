"""The doctor: every check reported on this machine, and each check's failing case made real."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from recorded import RecordedNvml
from skulk_hardware import doctor
from skulk_hardware.doctor import REGISTRY, DoctorContext, exit_code, render_docs, run_checks
from skulk_kernel.api import EngineProbe

ROOT = Path(__file__).resolve().parents[3]
GiB = 1024**3


def ctx(tmp_path: Path, **over: Any) -> DoctorContext:
    base: dict[str, Any] = {"home": tmp_path / "home", "models_dir": tmp_path / "models", "profile": "auto"}
    return DoctorContext(**(base | over))


def run_one(name: str, context: DoctorContext) -> doctor.CheckResult:
    (item,) = [c for c in REGISTRY if c.name == name]
    return item.run(context)


def test_registry_covers_the_issue() -> None:
    names = [c.name for c in REGISTRY]
    assert names == ["python", "plugins", "engines", "gpu", "ports", "disk", "memory", "multicast", "clock"]
    assert all(c.what and c.remediation for c in REGISTRY)


def test_docs_page_is_generated_from_the_registry() -> None:
    page = (ROOT / "docs" / "doctor.md").read_text()
    assert page == render_docs(), "docs/doctor.md is stale: run `python -m skulk_hardware.doctor_docs`"


def test_cli_json_on_this_machine_reports_every_check_and_exits_0(tmp_path: Path) -> None:
    env = {**os.environ, "SKULK_PROFILE": "auto", "SKULK_HOME": str(tmp_path), "SKULK_API_PORT": str(free_port())}
    out = subprocess.run(
        [sys.executable, "-m", "skulk_kernel.cli", "doctor", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    results = json.loads(out.stdout)
    assert [r["check"] for r in results] == [c.name for c in REGISTRY]
    assert all(r["status"] in ("ok", "warn", "skip") and r["detail"] for r in results), results


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------------------ failing cases


def test_python_too_old(tmp_path: Path) -> None:
    r = run_one("python", ctx(tmp_path, python_version=(3, 9)))
    assert r.status == "fail" and "3.9 is too old" in r.detail and "3.11" in r.remediation


def test_plugins_missing(tmp_path: Path) -> None:
    profile = tmp_path / "p.toml"
    profile.write_text('[profile]\nname = "p"\nplugins = ["master", "engine-nonexistent"]\n')
    r = run_one("plugins", ctx(tmp_path, profile=str(profile)))
    assert r.status == "fail" and "engine-nonexistent" in r.detail


class _Unusable:
    name = "broken"

    def probe(self) -> EngineProbe:
        return EngineProbe(
            available=False, reason="the vLLM cpu venv is not installed: run `skulk-kernel engines install vllm`"
        )


def test_engines_none_usable(tmp_path: Path) -> None:
    r = run_one("engines", ctx(tmp_path, engines={"broken": _Unusable()}))
    assert r.status == "fail" and "engines install vllm" in r.remediation


def test_gpu_driver_loaded_but_nvml_fails(tmp_path: Path) -> None:
    r = run_one("gpu", ctx(tmp_path, nvml=RecordedNvml("nvml-none.json"), nvidia_driver_present=True))
    assert r.status == "fail" and "NVML fails" in r.detail and "reboot" in r.remediation


def test_gpu_present_but_only_cpu_builds(tmp_path: Path) -> None:
    r = run_one("gpu", ctx(tmp_path, nvml=RecordedNvml("nvml-one-4090.json")))
    assert r.status == "warn" and "gpu_without_gpu_build" in r.data["conflicts"]
    assert "engines install vllm --flavor cuda" in r.remediation


def test_port_held_by_a_stranger(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        r = run_one("ports", ctx(tmp_path, api_port=port))
    assert r.status == "fail" and str(port) in r.detail and "--api-port" in r.remediation


def test_disk_short_and_fix_removes_staging(tmp_path: Path) -> None:
    models = tmp_path / "models"
    stale = models / ".staging-abc"
    stale.mkdir(parents=True)
    (stale / "part").write_bytes(b"x" * 4096)
    old = time.time() - 7200
    os.utime(stale, (old, old))
    r = run_one("disk", ctx(tmp_path, fail_free_disk_bytes=10**18))
    assert r.status == "fail" and "GiB free" in r.detail
    r = run_one("disk", ctx(tmp_path))
    assert r.status == "warn" and "abandoned staging" in r.detail
    (fixed,) = [x for x in run_checks(ctx(tmp_path, fix=True)) if x.check == "disk"]
    assert "removed" in fixed.fixed and not stale.exists() and fixed.status == "ok"


def test_memory_short(tmp_path: Path) -> None:
    r = run_one("memory", ctx(tmp_path, fail_available_ram_bytes=10**15))
    assert r.status == "fail" and "available" in r.detail


def test_multicast_on_a_missing_interface(tmp_path: Path) -> None:
    r = run_one("multicast", ctx(tmp_path, interface="skulk-no-such0"))
    assert r.status == "fail" and "--bootstrap-peers" in r.remediation


class _Member(BaseHTTPRequestHandler):
    """A node's API as the clock check sees it: /node_id, /state and a clock 30 s ahead."""

    port = 0
    skew = 30.0

    def do_GET(self) -> None:
        if self.path == "/node_id":
            body: Any = "node-a"
        elif self.path == "/state":
            body = {
                "nodeResources": {"node-a": {"apiAvailable": True, "apiPort": self.port, "addresses": ["127.0.0.1"]}}
            }
        elif self.path == "/v1/diagnostics/clock":
            body = {"unixTime": time.time() + self.skew}
        else:
            self.send_response(404)
            self.end_headers()
            return
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture
def member() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Member)
    _Member.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield _Member.port
    finally:
        server.shutdown()
        server.server_close()


def test_clock_skew_between_members(tmp_path: Path, member: int) -> None:
    r = run_one("clock", ctx(tmp_path, api_port=member))
    assert r.status == "warn" and abs(r.data["offsets"]["node-a"] - 30.0) < 1.0 and "NTP" in r.remediation


def test_clock_skips_with_a_reason_without_a_node(tmp_path: Path) -> None:
    r = run_one("clock", ctx(tmp_path, api_port=free_port()))
    assert r.status == "skip" and "start one" in r.detail


def test_a_raising_check_is_a_failure_not_a_crash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(_ctx: DoctorContext) -> doctor.CheckResult:
        raise RuntimeError("kaput")

    item = REGISTRY[6]
    patched = [*REGISTRY[:6], doctor.Check(item.name, item.title, item.what, item.remediation, boom), *REGISTRY[7:]]
    monkeypatch.setattr(doctor, "REGISTRY", patched)
    results = run_checks(ctx(tmp_path, api_port=free_port()))
    assert results[6].status == "fail" and "kaput" in results[6].detail and exit_code(results) == 1
