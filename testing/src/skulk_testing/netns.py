"""A network namespace joined to the host by a veth pair: another "machine" on this host (needs root).

The host side has ``host_ip`` and the namespace ``ns_ip`` on a /24 of their own; a process started
with :meth:`Netns.command` sees only the namespace's interfaces, so anything it reaches on the host
it reaches as a LAN peer would (loopback-only listeners are out of its reach).
"""

from __future__ import annotations

import json
import secrets
import subprocess
from typing import Any


class Netns:
    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self.name, self.host_if, self.ns_if = f"skulk-{tag}", f"sk{tag}h", f"sk{tag}n"
        octet = 16 + int(tag[:2], 16) % 200
        self.host_ip, self.ns_ip = f"10.250.{octet}.1", f"10.250.{octet}.2"

    def up(self) -> Netns:
        for cmd in (
            f"ip netns add {self.name}",
            f"ip link add {self.host_if} type veth peer name {self.ns_if}",
            f"ip link set {self.ns_if} netns {self.name}",
            f"ip addr add {self.host_ip}/24 dev {self.host_if}",
            f"ip link set {self.host_if} up",
            f"ip netns exec {self.name} ip addr add {self.ns_ip}/24 dev {self.ns_if}",
            f"ip netns exec {self.name} ip link set {self.ns_if} up",
            f"ip netns exec {self.name} ip link set lo up",
        ):
            subprocess.run(cmd.split(), check=True, capture_output=True)
        return self

    def down(self) -> None:
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)

    def http(self, method: str, url: str, key: str | None = None, body: Any = None) -> tuple[int, dict[str, str], Any]:
        """A request made from inside the namespace (curl), so the node sees a non-loopback client."""
        cmd = ["ip", "netns", "exec", self.name, "curl", "-s", "-m", "20", "-X", method, "-D", "-", url]
        if key:
            cmd += ["-H", f"Authorization: Bearer {key}"]
        if body is not None:
            cmd += ["-H", "content-type: application/json", "-d", json.dumps(body)]
        out = subprocess.run(cmd, capture_output=True, timeout=30).stdout.decode(errors="replace")
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
