"""A managed server process: start it in its own process group, wait for health, watch it, tear it down.

Why this shape: an OpenAI-compatible server (vLLM, llama.cpp's server) is a separate program with
its own children, so the runner that owns it must (1) start it in a new session, so one
``killpg`` reaches every process it forked; (2) record it in a pid file in the node's data dir,
so a node that crashed without tearing it down reaps it at the next start instead of leaving GBs
of memory held by an orphan; (3) notice when it dies on its own (OOM killer, ``kill -9``) and say
why, in an exit record the node-side watcher turns into a failed instance.

Files in ``run_dir`` (one pair per server, named by its key, e.g. the runner id):

    <key>.pid.json   written at start, removed at a clean stop: who runs, who owns it
    <key>.exit.json  written when the server died unexpectedly: the reason, and the labels
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger("skulk.engine_vllm.managed")
LAUNCHER = Path(__file__).with_name("launch.py")
PID_SUFFIX = ".pid.json"
EXIT_SUFFIX = ".exit.json"


class ServerError(RuntimeError):
    """The server could not start, became unhealthy, or died (the message says which and why)."""


class ServerSpec(BaseModel):
    """What to run and how to know it is up."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="what to call it in messages, e.g. 'vLLM'")
    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict, description="added to the inherited environment")
    host: str = "127.0.0.1"
    port: int
    health_path: str = "/health"
    ready_timeout_s: float = 600.0
    stop_grace_s: float = 10.0
    run_dir: Path = Field(description="the pid file's folder, in the node's data dir")
    key: str = Field(description="unique per server on this node (the runner id)")
    labels: dict[str, str] = Field(default_factory=dict, description="recorded in the pid and exit files")
    log_path: Path | None = None


class PidRecord(BaseModel):
    """The pid file: enough to tell a live server from a recycled pid, and whether its owner lives."""

    pid: int
    create_time: float
    owner_pid: int
    owner_create_time: float
    name: str
    port: int
    labels: dict[str, str] = Field(default_factory=dict)


class ExitRecord(BaseModel):
    key: str
    name: str
    reason: str
    labels: dict[str, str] = Field(default_factory=dict)


def _create_time(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def _same_process(pid: int, create_time: float) -> bool:
    found = _create_time(pid)
    return found is not None and abs(found - create_time) < 0.01


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


def kill_group(pgid: int, grace_s: float) -> None:
    """SIGTERM the whole group, wait up to `grace_s` for it to empty, then SIGKILL what is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and group_members(pgid):
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and group_members(pgid):
        time.sleep(0.05)


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group `pgid` (a zombie leader is its parent's to reap)."""
    found = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if os.getpgid(proc.pid) == pgid:
                found.append(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess, PermissionError, psutil.AccessDenied):
            continue
    return found


def reap_orphans(run_dir: Path, grace_s: float = 10.0) -> list[PidRecord]:
    """Kill servers whose owner (runner) is gone; remove their pid files. Returns what was reaped.

    A pid file whose owner still runs belongs to a live runner and is left alone; a server pid that
    no longer matches its recorded start time was recycled and is not touched.
    """
    reaped: list[PidRecord] = []
    if not run_dir.is_dir():
        return reaped
    for path in sorted(run_dir.glob("*" + PID_SUFFIX)):
        try:
            record = PidRecord.model_validate_json(path.read_text())
        except (OSError, ValueError):
            path.unlink(missing_ok=True)
            continue
        if _same_process(record.owner_pid, record.owner_create_time):
            continue
        if _same_process(record.pid, record.create_time):
            log.warning("reaping orphaned %s server (pid %d, port %d)", record.name, record.pid, record.port)
            kill_group(record.pid, grace_s)
            reaped.append(record)
        path.unlink(missing_ok=True)
    return reaped


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class ManagedServer:
    """One server process owned by this (runner) process. Thread-safe start/stop."""

    def __init__(self, spec: ServerSpec, on_exit: Callable[[str], None] | None = None) -> None:
        self.spec = spec
        self.on_exit = on_exit
        self.proc: subprocess.Popen[bytes] | None = None
        self.exit_reason: str | None = None
        self._stopping = False
        self._lock = threading.Lock()
        self._watch: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.spec.host}:{self.spec.port}"

    @property
    def pid_file(self) -> Path:
        return self.spec.run_dir / (self.spec.key + PID_SUFFIX)

    @property
    def exit_file(self) -> Path:
        return self.spec.run_dir / (self.spec.key + EXIT_SUFFIX)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 12) -> str:
        path = self.spec.log_path
        if path is None or not path.is_file():
            return ""
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - 16384))
            return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> ManagedServer:
        """Reap orphans, start the server, record it, and wait until its health route answers 200."""
        spec = self.spec
        spec.run_dir.mkdir(parents=True, exist_ok=True)
        reap_orphans(spec.run_dir, spec.stop_grace_s)
        self.exit_file.unlink(missing_ok=True)
        env = {**os.environ, **spec.env}
        out = open(spec.log_path, "ab") if spec.log_path else subprocess.DEVNULL
        try:
            with self._lock:
                self.proc = subprocess.Popen(
                    [sys.executable, str(LAUNCHER), str(os.getpid()), *spec.argv],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group: one killpg reaches its children
                )
        finally:
            if not isinstance(out, int):
                out.close()  # the child holds its own copy
        me = psutil.Process()
        record = PidRecord(
            pid=self.proc.pid,
            create_time=_create_time(self.proc.pid) or time.time(),
            owner_pid=me.pid,
            owner_create_time=me.create_time(),
            name=spec.name,
            port=spec.port,
            labels=spec.labels,
        )
        _write_atomic(self.pid_file, record.model_dump_json())
        log.info("%s server started (pid %d) on %s", spec.name, self.proc.pid, self.base_url)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        self._watch = threading.Thread(target=self._watch_exit, daemon=True, name=f"watch-{spec.key[:8]}")
        self._watch.start()
        return self

    def _wait_healthy(self) -> None:
        spec = self.spec
        deadline = time.monotonic() + spec.ready_timeout_s
        url = self.base_url + spec.health_path
        with httpx.Client(timeout=2.0) as client:
            while True:
                assert self.proc is not None
                code = self.proc.poll()
                if code is not None:
                    raise ServerError(
                        f"{spec.name} server {describe_exit(code)} before it was ready:\n{self.log_tail()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(url).status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise ServerError(
                        f"{spec.name} server was not healthy within {spec.ready_timeout_s:.0f}s:\n{self.log_tail()}"
                    )
                time.sleep(0.25)

    def _watch_exit(self) -> None:
        proc = self.proc
        assert proc is not None
        code = proc.wait()
        if self._stopping:
            return
        reason = f"the {self.spec.name} server (pid {proc.pid}) {describe_exit(code)}"
        log.error("%s", reason)
        kill_group(proc.pid, 2.0)  # whatever it forked (engine core workers) goes with it
        record = ExitRecord(key=self.spec.key, name=self.spec.name, reason=reason, labels=self.spec.labels)
        with contextlib.suppress(OSError):
            _write_atomic(self.exit_file, record.model_dump_json())
            self.pid_file.unlink(missing_ok=True)
        self.exit_reason = reason  # last: whoever sees it can rely on the files
        if self.on_exit is not None:
            self.on_exit(reason)

    def stop(self) -> None:
        """SIGTERM the group, SIGKILL after the grace period; remove the pid file. Idempotent."""
        with self._lock:
            self._stopping = True
            proc = self.proc
        if proc is not None:
            if proc.poll() is None:
                kill_group(proc.pid, self.spec.stop_grace_s)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(2)
            # anything it forked that outlived the leader
            if members := group_members(proc.pid):
                log.warning("%s server left %d process(es); killing them", self.spec.name, len(members))
                kill_group(proc.pid, 1.0)
        self.pid_file.unlink(missing_ok=True)


def read_exit_records(run_dir: Path) -> list[tuple[Path, ExitRecord]]:
    """Exit records waiting to be reported (the node-side watcher consumes them)."""
    found = []
    for path in sorted(run_dir.glob("*" + EXIT_SUFFIX)) if run_dir.is_dir() else ():
        try:
            found.append((path, ExitRecord.model_validate_json(path.read_text())))
        except (OSError, ValueError):
            path.unlink(missing_ok=True)
    return found


def free_port(host: str = "127.0.0.1") -> int:
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
