"""Helpers for the transport-zenoh tests: loopback configs, isolated versions, peer processes.

Every test uses a network version of its own (so no other Zenoh session on this host, such as a
parallel test run, can join it) and, with multicast on, a scouting port of its own on `lo`.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from skulk_transport_zenoh.config import ZenohConfig

PEER_SCRIPT = Path(__file__).with_name("zenoh_peer.py")


def unique_version() -> str:
    return f"t{os.getpid()}-{secrets.token_hex(3)}"


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def multicast_group() -> str:
    return f"224.0.0.224:{free_udp_port()}"


def loopback_config(
    version: str, *, multicast: str | None = None, connect: list[str] | tuple[str, ...] = (), **overrides: Any
) -> ZenohConfig:
    """Listen on 127.0.0.1 (a free port); multicast scouting only when `multicast` names a group."""
    fields: dict[str, Any] = dict(
        listen=["tcp/127.0.0.1:0"],
        connect=list(connect),
        network_version=version,
        multicast_scouting=multicast is not None,
        multicast_address=multicast,
        multicast_interface="lo" if multicast else None,
        hello_interval_s=0.5,
    )
    fields.update(overrides)
    return ZenohConfig(**fields)


async def wait_until(check: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll `check` until true; the seconds it took. TimeoutError names `what`."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)
    return time.monotonic() - started


def _die_with_parent() -> None:
    """In the child: SIGKILL when the test process dies, even while SIGSTOPped (Linux)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except Exception:
        pass


class PeerProcess:
    """zenoh_peer.py in its own process group; JSON lines from its stdout collected on a thread."""

    def __init__(
        self,
        node: str,
        version: str,
        *,
        connect: list[str] | tuple[str, ...] = (),
        multicast: str | None = None,
        tick: bool = False,
        lease_s: float = 3.0,
    ) -> None:
        self.node = node
        self.version = version
        cmd = [sys.executable, str(PEER_SCRIPT), "--node", node, "--version", version, "--lease", str(lease_s)]
        for endpoint in connect:
            cmd += ["--connect", endpoint]
        if multicast:
            cmd += ["--multicast-address", multicast]
        if tick:
            cmd.append("--tick")
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        self.stderr: list[str] = []
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        self.locators: list[str] = []

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                self.lines.put(json.loads(raw))
            except ValueError:
                self.stderr.append(raw.decode(errors="replace"))

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self.stderr.append(raw.decode(errors="replace"))

    def _drain(self) -> None:
        while True:
            try:
                self.seen.append(self.lines.get_nowait())
            except queue.Empty:
                return

    async def wait_line(self, check: Callable[[dict[str, Any]], bool], timeout: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        index = 0
        while True:
            self._drain()
            for line in self.seen[index:]:
                if check(line):
                    return line
            index = len(self.seen)
            if self.proc.poll() is not None and self.lines.empty():
                raise RuntimeError(
                    f"peer {self.node} exited ({self.proc.returncode}) waiting for {what}:\n"
                    + "".join(self.stderr[-40:])
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"peer {self.node}: no {what} in {timeout}s; stderr:\n" + "".join(self.stderr[-40:]))
            await asyncio.sleep(0.01)

    async def ready(self, timeout: float = 20) -> PeerProcess:
        line = await self.wait_line(lambda d: "ready" in d, timeout, "ready line")
        self.locators = list(line["ready"])
        return self

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = 10) -> int:
        """Close stdin (a clean stop), then SIGKILL if it lingers. Always reaps the process."""
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
                return self.proc.wait(timeout=timeout)
            except (subprocess.TimeoutExpired, OSError, ValueError):
                self.signal(signal.SIGKILL)
        return self.proc.wait(timeout=timeout)
