"""The echo engine's rank group: real TCP connections between the ranks of a multi-rank instance.

Echo splits nothing (every rank answers the whole prompt), but its ranks really form a group the
way a splitting engine's do, so the worker's multi-rank path is tested fast and exactly: the group
forms from the planner's `RankGroup` within its deadline or fails with the ranks that never
joined, and each rank checks its peers before every token, so a dead peer breaks the group at
once (as a collective on a dead peer raises).
"""

from __future__ import annotations

import contextlib
import select
import socket
import time

from skulk_kernel.api import RankGroup

HELLO = b"skulk-echo-rank:"


def _split(host: str) -> tuple[str, int]:
    address, _, port = host.rpartition(":")
    return address, int(port)


class EchoGroup:
    """A full mesh: rank r accepts every higher rank and connects to every lower one."""

    def __init__(self, group: RankGroup, rank: int) -> None:
        self.group = group
        self.rank = rank
        self.peers: dict[int, socket.socket] = {}

    def form(self) -> None:
        hosts = self.group.hosts
        deadline = time.monotonic() + self.group.formation_deadline_s
        listener = socket.create_server(_split(hosts[self.rank]), reuse_port=False)
        listener.settimeout(0.2)
        try:
            while len(self.peers) < len(hosts) - 1:
                if time.monotonic() > deadline:
                    missing = sorted(set(range(len(hosts))) - set(self.peers) - {self.rank})
                    raise TimeoutError(
                        f"rank {self.rank} of {len(hosts)} could not form its group within "
                        f"{self.group.formation_deadline_s:.0f}s: rank(s) {missing} "
                        f"({', '.join(hosts[r] for r in missing)}) never joined"
                    )
                for lower in range(self.rank):
                    if lower not in self.peers:
                        with contextlib.suppress(OSError):
                            conn = socket.create_connection(_split(hosts[lower]), timeout=0.5)
                            conn.sendall(HELLO + str(self.rank).encode() + b"\n")
                            self.peers[lower] = conn
                with contextlib.suppress(TimeoutError):
                    conn, _ = listener.accept()
                    conn.settimeout(2)
                    hello = conn.recv(64)
                    if hello.startswith(HELLO):
                        self.peers[int(hello[len(HELLO) :].strip())] = conn
                    else:
                        conn.close()
        finally:
            listener.close()

    def check(self) -> None:
        """Raise if a peer has left (its socket reads as closed)."""
        readable, _, _ = select.select(list(self.peers.values()), [], [], 0)
        for conn in readable:
            if conn.recv(1, socket.MSG_PEEK) == b"":
                rank = next(r for r, c in self.peers.items() if c is conn)
                raise ConnectionError(f"rank {rank} ({self.group.hosts[rank]}) left the group")

    def close(self) -> None:
        for conn in self.peers.values():
            with contextlib.suppress(OSError):
                conn.close()
        self.peers.clear()
