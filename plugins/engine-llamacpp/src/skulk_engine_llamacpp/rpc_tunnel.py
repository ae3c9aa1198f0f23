"""llama.cpp RPC carried only between members: loopback servers, mutual-TLS tunnels between them.

Why: llama.cpp's RPC protocol has no authentication, and its own documentation says never to expose
``ggml-rpc-server`` on an open network (its messages can read and write the host's memory). So every
``ggml-rpc-server`` listens on 127.0.0.1 only, and a rank is reached through a tunnel:

    driver (rank 0)                                        rank k
    llama-server --rpc 127.0.0.1:L  ->  local listener L  ==TLS==>  listener at the rank's group
                                                                     address  ->  127.0.0.1:rpc port

Both ends present a certificate the cluster CA signed (``skulk_transport_zenoh.tls``: the CA is
derived from the cluster secret, so members agree on it without distributing anything) and require
one from the other side (TLS 1.3, mutual): a host without the cluster secret fails the handshake
and never reaches a byte of the RPC protocol. Sockets are TCP_NODELAY: decoding is a stream of small
round trips. One asyncio loop on a daemon thread carries every connection of the runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
import tempfile
import threading
import time
import uuid
from collections.abc import Coroutine
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

log = logging.getLogger("skulk.engine.llamacpp.rpc")
T = TypeVar("T")
CHUNK = 1 << 18


class TunnelError(RuntimeError):
    """A tunnel could not be opened; the message names the peer and why."""


@dataclass
class MemberTls:
    """Server and client TLS contexts of this member (a fresh certificate of the cluster CA)."""

    server: ssl.SSLContext
    client: ssl.SSLContext
    cluster_id: str = ""

    @classmethod
    def from_pem(cls, ca: bytes, cert: bytes, key: bytes, cluster_id: str = "") -> MemberTls:
        server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        client.check_hostname = False  # membership is what is checked, not names (nodes move)
        with tempfile.TemporaryDirectory(prefix="skulk-rpc-tls-") as tmp:
            cert_file, key_file = Path(tmp) / "node.pem", Path(tmp) / "node.key"
            cert_file.write_bytes(cert)
            key_file.touch(mode=0o600)
            key_file.write_bytes(key)
            for ctx in (server, client):
                ctx.minimum_version = ssl.TLSVersion.TLSv1_3
                ctx.verify_mode = ssl.CERT_REQUIRED
                ctx.load_verify_locations(cadata=ca.decode())
                ctx.load_cert_chain(cert_file, key_file)
        return cls(server, client, cluster_id)

    @classmethod
    def of_this_node(cls) -> MemberTls:
        """From the node's cluster secret (the runner inherits the node's ``SKULK_HOME``)."""
        from skulk_transport_zenoh.secret import resolve_secret
        from skulk_transport_zenoh.tls import node_certificate

        home = os.environ.get("SKULK_HOME")
        cluster = resolve_secret(Path(home).expanduser() if home else None, None, create=False)
        ca, cert, key = node_certificate(cluster, f"rpc-{uuid.uuid4().hex[:12]}")
        return cls.from_pem(ca, cert, key, cluster.cluster_id)


def _nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


@dataclass
class TunnelStats:
    connections: int = 0  # members' connections carried to an rpc-server or from a driver
    bytes_up: int = 0  # towards the rpc-server
    bytes_down: int = 0
    closed_by_peer: list[str] = field(default_factory=list)


class Tunnels:
    """Every tunnel end of one runner, on one event loop thread."""

    def __init__(self, tls: MemberTls) -> None:
        self.tls = tls
        self.stats = TunnelStats()
        self._loop = asyncio.new_event_loop()
        self._servers: list[asyncio.base_events.Server] = []
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="rpc-tunnels")
        self._thread.start()

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = 30.0) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout)

    # ---------------------------------------------------------------- both directions

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: bool) -> None:
        try:
            while data := await reader.read(CHUNK):
                writer.write(data)
                if up:
                    self.stats.bytes_up += len(data)
                else:
                    self.stats.bytes_down += len(data)
                await writer.drain()
        except (ConnectionError, OSError, ssl.SSLError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _join(self, a: tuple[Any, Any], b: tuple[Any, Any], label: str) -> None:
        """Copy both ways until either side closes, then close both (a half-open RPC link is dead)."""
        up = asyncio.ensure_future(self._pipe(a[0], b[1], True))
        down = asyncio.ensure_future(self._pipe(b[0], a[1], False))
        _done, pending = await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        for w in (a[1], b[1]):
            with contextlib.suppress(Exception):
                w.close()
        self.stats.closed_by_peer.append(label)

    # ---------------------------------------------------------------- the rank's side

    def expose(self, listen: str, target_port: int) -> int:
        """Accept members' TLS connections at ``host:port`` and carry each to 127.0.0.1:`target_port`.
        Returns the port bound (``listen`` may ask for 0)."""
        host, _, port = listen.rpartition(":")
        return self._call(self._expose(host, int(port), target_port))

    async def _expose(self, host: str, port: int, target: int) -> int:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            peer = writer.get_extra_info("peername")
            _nodelay(writer)
            try:
                back = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", target), 10)
            except (OSError, TimeoutError) as exc:
                log.error("rpc tunnel from %s: the local rpc-server (port %d) is gone: %s", peer, target, exc)
                writer.close()
                return
            _nodelay(back[1])
            self.stats.connections += 1
            await self._join((reader, writer), back, f"member {peer}")

        # asyncio completes the handshake before `handle` runs (a non-member never gets that far); TLS must
        # start here, not with start_tls in the handler: a ClientHello already buffered there is lost
        server = await asyncio.start_server(
            handle, host, port, ssl=self.tls.server, ssl_handshake_timeout=10, reuse_address=True
        )
        self._servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    # ---------------------------------------------------------------- the driver's side

    def reach(self, remote: str) -> int:
        """A loopback port whose connections are carried over TLS to the rank listening at `remote`."""
        return self._call(self._reach(remote))

    async def _reach(self, remote: str) -> int:
        host, _, port = remote.rpartition(":")

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            _nodelay(writer)
            try:
                far = await asyncio.wait_for(
                    asyncio.open_connection(host, int(port), ssl=self.tls.client, server_hostname=host), 10
                )
            except (OSError, TimeoutError, ssl.SSLError) as exc:
                log.error("rpc tunnel to %s failed: %s", remote, exc)
                writer.close()
                return
            _nodelay(far[1])
            self.stats.connections += 1
            await self._join((reader, writer), far, f"rank at {remote}")

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self._servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    def wait_reachable(self, remote: str, deadline_s: float) -> None:
        """Block until a TLS handshake with `remote` succeeds, or raise TunnelError at the deadline."""
        host, _, port = remote.rpartition(":")
        until = time.monotonic() + deadline_s
        last = "no attempt"
        while time.monotonic() < until:
            try:
                with socket.create_connection((host, int(port)), timeout=2) as raw:
                    with self.tls.client.wrap_socket(raw, server_hostname=host):
                        return
            except (OSError, ssl.SSLError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(0.2)
        raise TunnelError(f"rank at {remote} did not answer within {deadline_s:.0f} s ({last})")

    def close(self) -> None:
        async def stop() -> None:
            for server in self._servers:
                server.close()

        with contextlib.suppress(Exception):
            self._call(stop(), timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
