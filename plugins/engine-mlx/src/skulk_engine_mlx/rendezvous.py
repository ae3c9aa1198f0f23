"""A ring rendezvous in plain Python before MLX's own ring init, so formation honours its deadline.

Why: ``mx.distributed.init(backend="ring")`` holds the GIL while it connects (a rank whose right
neighbour is missing gives up after about 31 s of retries; a rank waiting for its left
neighbour blocks forever), so no Python timeout can interrupt it and it cannot say which peer is
missing. So each rank first meets its neighbours on the same ``ip:port`` the ring will use:
it listens for its left neighbour and connects to its right one, then a token goes round the
ring twice (first: everyone is here; second: start now). Only then do the ranks close these
sockets and call MLX's init, all within milliseconds, which its own retries easily cover.
Sockets are closed connector-first, so TIME_WAIT lands on the connector's ephemeral port and the
listening port is free for MLX to bind again.
"""

from __future__ import annotations

import socket
import time

from skulk_kernel.api import RankGroup

HELLO = b"SKULK-RING1"
READY, START = b"R", b"S"


class FormationTimeout(TimeoutError):
    """The group did not form within its deadline; the message names the missing peer."""


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _left(rank: int, size: int) -> int:
    return (rank - 1) % size


def _right(rank: int, size: int) -> int:
    return (rank + 1) % size


class _Deadline:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        return self.at - time.monotonic()


def _listen(address: str) -> socket.socket:
    host, port = _split(address)
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError:
        listener.bind(("", port))  # the advertised ip may be a NAT/alias address of this host
    listener.listen(4)
    return listener


def _recv_exact(conn: socket.socket, n: int, deadline: _Deadline) -> bytes | None:
    data = b""
    while len(data) < n:
        remaining = deadline.left()
        if remaining <= 0:
            return None
        conn.settimeout(remaining)
        try:
            part = conn.recv(n - len(data))
        except (TimeoutError, OSError):
            return None
        if not part:
            return None
        data += part
    return data


def rendezvous(group: RankGroup, rank: int, deadline_s: float | None = None) -> None:
    """Return when every rank of `group` is present and starting; raise FormationTimeout otherwise."""
    size = len(group.hosts)
    if size < 2:
        return
    deadline = _Deadline(deadline_s if deadline_s is not None else group.formation_deadline_s)
    left, right = _left(rank, size), _right(rank, size)

    def missing(who: int, what: str) -> FormationTimeout:
        return FormationTimeout(
            f"rank {rank} of {size} could not form its group within {deadline.seconds:g} s: "
            f"peer rank {who} at {group.hosts[who]} {what}"
        )

    listener = _listen(group.hosts[rank])
    inbound: socket.socket | None = None
    outbound: socket.socket | None = None
    try:
        # Accept the left neighbour while connecting to the right one (either may come first).
        listener.setblocking(False)
        while inbound is None or outbound is None:
            if deadline.left() <= 0:
                raise missing(left if inbound is None else right, "never joined")
            if inbound is None:
                try:
                    candidate, _ = listener.accept()
                    candidate.setblocking(True)
                    hello = _recv_exact(candidate, len(HELLO) + 4, _Deadline(min(5.0, max(0.1, deadline.left()))))
                    if hello is not None and hello[: len(HELLO)] == HELLO and int(hello[len(HELLO) :]) == left:
                        inbound = candidate
                    else:
                        candidate.close()  # a stray connection: not our neighbour
                except BlockingIOError:
                    pass
            if outbound is None:
                try:
                    host, port = _split(group.hosts[right])
                    conn = socket.create_connection((host, port), timeout=0.5)
                    conn.sendall(HELLO + b"%04d" % rank)
                    outbound = conn
                except OSError:
                    pass
            if inbound is None or outbound is None:
                time.sleep(0.05)
        listener.close()  # nothing else may connect to this port before MLX binds it
        for token in (READY, START):
            if rank == 0:
                outbound.sendall(token)
                if _recv_exact(inbound, 1, deadline) != token:
                    raise FormationTimeout(
                        f"rank 0 of {size} could not form its group within {deadline.seconds:g} s: "
                        "not every rank joined (the ring token did not come back)"
                    )
            else:
                if _recv_exact(inbound, 1, deadline) != token:
                    raise missing(left, "did not pass the ring token on (a rank further round never joined)")
                outbound.sendall(token)
        outbound.close()  # connector closes first: TIME_WAIT stays on its ephemeral port
        outbound = None
        _recv_exact(inbound, 1, _Deadline(min(2.0, max(0.1, deadline.left()))))  # wait for the left's close
    finally:
        for sock in (listener, inbound, outbound):
            if sock is not None:
                sock.close()
