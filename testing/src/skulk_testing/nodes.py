"""Real node processes for tests: `skulk-kernel run` in a subprocess, stopped for sure.

Every node gets its own SKULK_HOME and a free API port, exactly how several nodes share a host.
The process runs in its own process group so a test can kill it (and its runners) for real.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

#: Ports tests hand to nodes: below the multi-rank ring ports (20000-32003) and every ephemeral range
#: (Linux 32768-60999, macOS and Windows 49152-65535).
TEST_PORTS = range(10000, 20000)


def free_port() -> int:
    """A port nothing listens on now, drawn at random outside the ephemeral range.

    A port from bind(0) is an ephemeral one: between this check and the node's own bind, any
    process's listener on port 0 or outgoing connection (a Zenoh node of a parallel test) can take
    it, and the node then fails to start while its port answers in another protocol (seen under the
    parallel suite). Drawn from TEST_PORTS, a port is taken only by another test drawing the same one.
    """
    draw = random.SystemRandom()
    for _ in range(500):
        port = draw.randrange(TEST_PORTS.start, TEST_PORTS.stop)
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {TEST_PORTS}")


@dataclass
class NodeProcess:
    profile: str
    home: Path
    api_port: int
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def start(self) -> NodeProcess:
        self.home.mkdir(parents=True, exist_ok=True)
        self.log_path = self.home / "node.log"
        env = {**os.environ, "SKULK_HOME": str(self.home), "HF_HUB_OFFLINE": "1", **self.env}
        cmd = [
            sys.executable,
            "-m",
            "skulk_kernel.cli",
            "run",
            "--profile",
            self.profile,
            "--api-port",
            str(self.api_port),
            "--api-host",
            "127.0.0.1",
            *self.args,
        ]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.get(self.url + path, timeout=kwargs.pop("timeout", 10), **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.post(self.url + path, timeout=kwargs.pop("timeout", 30), **kwargs)

    def wait_until(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"node exited with {self.proc.returncode} while waiting for {what}:\n{self.log()[-4000:]}"
                )
            try:
                if check():
                    return
            except (httpx.HTTPError, KeyError, ValueError):
                pass
            time.sleep(0.2)
        raise TimeoutError(f"timed out after {timeout}s waiting for {what}:\n{self.log()[-4000:]}")

    def wait_api(self, timeout: float = 60) -> NodeProcess:
        self.wait_until(lambda: self.get("/node_id", timeout=2).status_code == 200, timeout, "the API")
        return self

    def state(self) -> dict[str, Any]:
        return self.get("/state").json()

    def ready_instances(self, model_id: str | None = None) -> list[str]:
        state = self.state()
        ready = []
        for wrapped in state["instances"].values():
            inst = next(iter(wrapped.values()))
            sa = inst["shardAssignments"]
            if model_id and sa["modelId"] != model_id:
                continue
            statuses = [next(iter(state["runners"].get(r, {"?": 0}))) for r in sa["runnerToShard"]]
            if statuses and all(s in ("RunnerReady", "RunnerRunning") for s in statuses):
                ready.append(inst["instanceId"])
        return ready

    def wait_ready(self, model_id: str | None = None, timeout: float = 120) -> NodeProcess:
        self.wait_until(lambda: bool(self.ready_instances(model_id)), timeout, f"a ready instance of {model_id}")
        return self

    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the node's whole process group (the node and its runners)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, timeout: float = 15) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.kill(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill(signal.SIGKILL)  # anything left in the group, runners included
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass


def start_node(
    profile: str, *args: str, home: Path | None = None, env: dict[str, str] | None = None, api_port: int | None = None
) -> NodeProcess:
    node = NodeProcess(
        profile=profile,
        home=home or Path(tempfile.mkdtemp(prefix="skulk-node-")),
        api_port=api_port or free_port(),
        args=args,
        env=env or {},
    )
    return node.start()


@contextlib.asynccontextmanager
async def in_process_node(profile: Any, *, home: Path, pm: Any = None, **options: Any) -> AsyncIterator[Any]:
    """A real Node started inside the test's event loop (no subprocess), stopped on exit.

    profile: a Profile, a bundled profile name or .toml path, or a sequence of plugin names.
    options: NodeOptions fields; the API is off unless `no_api=False` is passed.
    """
    from skulk_kernel.api import Profile, load_profile
    from skulk_kernel.node import Node, NodeOptions

    if isinstance(profile, (str, Path)):
        profile = load_profile(profile)
    elif not isinstance(profile, Profile):
        profile = Profile(name="in-process", plugins=tuple(profile))
    options.setdefault("no_api", True)
    options.setdefault("node_name", "in-process")
    node = Node(profile, NodeOptions(home=home, **options), pm=pm)
    await node.start()
    try:
        yield node
    finally:
        await node.stop()
