"""Network namespaces: other "machines" on this host (needs root).

Two shapes, one helper:

* alone (``Netns()``): joined to the host by a veth pair; the host side has ``host_ip`` and the
  namespace ``ns_ip`` on a /24 of their own;
* on a LAN (``Bridge().up()`` then ``bridge.join()``): every namespace's veth ends on one bridge,
  each namespace has its own address on the bridge's /24 and the host has ``host_ip`` there (the
  "gateway"). Namespaces reach each other as LAN peers do, never through a loopback.

A process started with :meth:`Netns.command` sees only its namespace's interfaces, so anything it
reaches elsewhere it reaches as a LAN peer would (loopback-only listeners are out of its reach).
"""

from __future__ import annotations

import json
import secrets
import subprocess
from typing import Any


def _ip(*commands: str) -> None:
    for cmd in commands:
        subprocess.run(cmd.split(), check=True, capture_output=True)


class Bridge:
    """A LAN on this host: a Linux bridge with the host at ``.1`` and one address per namespace."""

    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self.name = f"skb{tag}"
        octet = 16 + int(tag[:2], 16) % 200
        self.prefix = f"10.251.{octet}"
        self.host_ip = f"{self.prefix}.1"
        self.members: list[Netns] = []

    def up(self) -> Bridge:
        _ip(
            f"ip link add {self.name} type bridge",
            f"ip addr add {self.host_ip}/24 dev {self.name}",
            f"ip link set {self.name} up",
        )
        return self

    def join(self) -> Netns:
        """A new namespace on this LAN, with the next free address."""
        ns = Netns(bridge=self, ns_ip=f"{self.prefix}.{len(self.members) + 2}").up()
        self.members.append(ns)
        return ns

    def down(self) -> None:
        for ns in self.members:
            ns.down()
        self.members.clear()
        subprocess.run(["ip", "link", "del", self.name], capture_output=True)


class Netns:
    def __init__(self, bridge: Bridge | None = None, ns_ip: str | None = None) -> None:
        tag = secrets.token_hex(3)
        self.name, self.host_if, self.ns_if = f"skulk-{tag}", f"sk{tag}h", f"sk{tag}n"
        self.bridge = bridge
        if bridge is not None:
            assert ns_ip is not None
            self.host_ip, self.ns_ip = bridge.host_ip, ns_ip
        else:
            octet = 16 + int(tag[:2], 16) % 200
            self.host_ip, self.ns_ip = f"10.250.{octet}.1", f"10.250.{octet}.2"

    def up(self) -> Netns:
        _ip(
            f"ip netns add {self.name}",
            f"ip link add {self.host_if} type veth peer name {self.ns_if}",
            f"ip link set {self.ns_if} netns {self.name}",
        )
        if self.bridge is not None:
            _ip(f"ip link set {self.host_if} master {self.bridge.name}")
        else:
            _ip(f"ip addr add {self.host_ip}/24 dev {self.host_if}")
        _ip(
            f"ip link set {self.host_if} up",
            f"ip netns exec {self.name} ip addr add {self.ns_ip}/24 dev {self.ns_if}",
            f"ip netns exec {self.name} ip link set {self.ns_if} up",
            f"ip netns exec {self.name} ip link set lo up",
        )
        if self.bridge is not None:  # the host is the LAN's gateway (multicast needs a route too)
            _ip(f"ip netns exec {self.name} ip route add default via {self.host_ip}")
        return self

    def down(self) -> None:
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)

    def http(
        self, method: str, url: str, key: str | None = None, body: Any = None, timeout: float = 20
    ) -> tuple[int, dict[str, str], Any]:
        """A request made from inside the namespace (curl), so the node sees a non-loopback client."""
        cmd = ["ip", "netns", "exec", self.name, "curl", "-s", "-m", str(timeout), "-X", method, "-D", "-", url]
        if key:
            cmd += ["-H", f"Authorization: Bearer {key}"]
        if body is not None:
            cmd += ["-H", "content-type: application/json", "-d", json.dumps(body)]
        out = subprocess.run(cmd, capture_output=True, timeout=timeout + 10).stdout.decode(errors="replace")
        head, _, text = out.replace("\r\n", "\n").partition("\n\n")
        while text.startswith("HTTP/"):  # 100-continue
            head, _, text = text.partition("\n\n")
        lines = head.split("\n")
        status = int(lines[0].split()[1]) if lines and lines[0].startswith("HTTP/") else 0
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        try:
            return status, headers, json.loads(text)
        except ValueError:
            return status, headers, text

    def command(self, *argv: str) -> list[str]:
        """`argv` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *argv]
