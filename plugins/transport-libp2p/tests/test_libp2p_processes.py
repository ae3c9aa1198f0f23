"""Real peer processes (libp2p_peer.py) against a transport in this process: kill -9, SIGSTOP past
the lease then SIGCONT, garbage frames from a process of the right version, and a 2,000-message
burst across processes. Every process is reaped; every wait is bounded."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from libp2p_helpers import wait_until
from skulk_kernel.api import PeerEvent, Topic
from skulk_testing.conformance import Inbox

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
LEASE_S = 3.0


class Peer:
    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.stderr: list[str] = []
        self.seen: list[dict[str, Any]] = []
        threading.Thread(target=self._read, args=(self.proc.stdout, True), daemon=True).start()
        threading.Thread(target=self._read, args=(self.proc.stderr, False), daemon=True).start()

    def _read(self, pipe: Any, json_lines: bool) -> None:
        for raw in pipe:
            text = raw.decode(errors="replace")
            try:
                self.lines.put(json.loads(text)) if json_lines else self.stderr.append(text)
            except ValueError:
                self.stderr.append(text)

    async def wait_line(self, check: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            while not self.lines.empty():
                self.seen.append(self.lines.get_nowait())
            for line in self.seen:
                if check(line):
                    return line
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise TimeoutError(f"no such line in {timeout}s: {self.seen}\n" + "".join(self.stderr[-30:]))
            await asyncio.sleep(0.02)

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
                self.proc.wait(10)
            except (subprocess.TimeoutExpired, OSError, ValueError):
                self.signal(signal.SIGKILL)
        self.proc.wait(10)


@pytest.fixture
def spawn(version: str) -> Iterator[Callable[..., Peer]]:
    peers: list[Peer] = []

    def start(node: str, bootstrap: list[str], *extra: str) -> Peer:
        args = [str(HERE / "libp2p_peer.py"), "--node", node, "--version", version, *extra]
        for addr in bootstrap:
            args += ["--bootstrap", addr]
        peers.append(Peer(*args))
        return peers[-1]

    yield start
    for peer in peers:
        peer.stop()


async def hub_with_peer(make_transport: Any, spawn: Any, name: str, *extra: str) -> tuple[Any, Peer, list[Any]]:
    hub = await make_transport("hub", lease_s=LEASE_S)
    events: list[tuple[float, PeerEvent]] = []
    hub.on_peer(lambda e: events.append((time.monotonic(), e)))
    peer = spawn(name, hub.listen[:1], *extra)
    await peer.wait_line(lambda d: "ready" in d, 30)
    await wait_until(lambda: name in hub.peers, 20, f"{name} to join")
    return hub, peer, events


async def test_kill_9_of_a_peer_is_noticed_at_once(make_transport: Any, spawn: Any) -> None:
    _hub, peer, events = await hub_with_peer(make_transport, spawn, "victim")
    killed = time.monotonic()
    peer.signal(signal.SIGKILL)
    await wait_until(lambda: any(e == PeerEvent("victim", False) for _, e in events), 5, "victim to leave")
    took = next(t for t, e in events if e == PeerEvent("victim", False)) - killed
    print(f"kill -9 -> PeerEvent(left) after {took * 1000:.0f} ms")
    assert took < 1.5


async def test_sigstop_leaves_after_the_lease_and_sigcont_rejoins(make_transport: Any, spawn: Any) -> None:
    hub, peer, events = await hub_with_peer(make_transport, spawn, "sleeper")
    stopped = time.monotonic()
    peer.signal(signal.SIGSTOP)
    for i in range(200):  # publishing towards a frozen peer never blocks the caller
        await hub.publish(Topic.COMMANDS, b"while frozen %d" % i)
    await wait_until(lambda: "sleeper" not in hub.peers, LEASE_S + 3, "the frozen peer to be dropped")
    left = next(t for t, e in events if e == PeerEvent("sleeper", False))
    print(f"SIGSTOP -> PeerEvent(left) after {(left - stopped) * 1000:.0f} ms (lease {LEASE_S} s)")
    assert left - stopped < LEASE_S + 1.5
    resumed = time.monotonic()
    peer.signal(signal.SIGCONT)
    await wait_until(lambda: "sleeper" in hub.peers, 20, "the thawed peer to rejoin")
    print(f"SIGCONT -> PeerEvent(joined) after {(time.monotonic() - resumed) * 1000:.0f} ms")
    inbox = Inbox()
    hub.subscribe(Topic.LOCAL_EVENTS, inbox)
    await asyncio.sleep(1.5)
    await hub.publish(Topic.COMMANDS, b"ping")
    await wait_until(lambda: b"ping" in inbox.payloads(), 10, "the thawed peer to echo")


async def test_garbage_frames_do_not_kill_the_node(make_transport: Any, spawn: Any, version: str) -> None:
    hub, _peer, _events = await hub_with_peer(make_transport, spawn, "friend")
    target = next(a for a in hub.listen if "/p2p/" in a)
    attack = subprocess.run(
        [sys.executable, str(HERE / "libp2p_attacker.py"), "--version", version, "--target", target],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "done" in attack.stdout, attack.stdout + attack.stderr
    assert hub.restarts == 0 or hub.peers, "the hub must survive (a restart at most)"
    await wait_until(lambda: "friend" in hub.peers, 20, "the friend to be (still) connected")
    assert hub.describe()["malformed_frames"] >= 1
    inbox = Inbox()
    hub.subscribe(Topic.LOCAL_EVENTS, inbox)
    await asyncio.sleep(1.5)
    await hub.publish(Topic.COMMANDS, b"still alive")
    await wait_until(lambda: b"still alive" in inbox.payloads(), 10, "an echo after the attack")
    print(f"after the attack: {hub.describe()['malformed_frames']} malformed frames, {hub.restarts} restarts")


async def test_a_node_without_the_cluster_secret_cannot_connect(make_transport: Any, version: str) -> None:
    hub = await make_transport("hub")
    target = next(a for a in hub.listen if "/p2p/" in a)
    outsider = subprocess.run(
        [sys.executable, str(HERE / "libp2p_attacker.py"), "--version", version, "--target", target, "--outsider"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "refused" in outsider.stdout, outsider.stdout + outsider.stderr
    assert not hub.peers


async def test_a_burst_of_2000_across_processes_arrives_in_order(make_transport: Any, spawn: Any) -> None:
    hub = await make_transport("hub")
    inbox = Inbox()
    hub.subscribe(Topic.GLOBAL_EVENTS, inbox)
    peer = spawn("bursty", hub.listen[:1], "--burst", "2000")
    await peer.wait_line(lambda d: "burst_sent" in d, 60)
    started = time.monotonic()
    await inbox.wait_for(2000, 30)
    assert inbox.payloads() == [b"burst-%d" % i for i in range(2000)]
    assert {s for s, _ in inbox.messages} == {"bursty"}
    print(f"2000-message burst complete and in order ({time.monotonic() - started:.2f}s after the last publish)")
