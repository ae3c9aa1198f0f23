"""Nodes on a LAN of network namespaces: each node its own "machine" (needs root).

`LanNode` runs one node inside a namespace of a :class:`~skulk_testing.netns.Bridge`, its API on
the namespace's own address. Nothing reaches it through a loopback: the test process talks to it
from the bridge's host address, as a laptop on the LAN would, so it needs an API key like any
other host (`key`, sent on every `get`/`post`). Until a key exists, `local()` asks the node from
inside its own namespace (its loopback, where no key is needed): that is how the first operator
key is made, as an operator would on the machine itself.

Machines apart do not share a disk either: with `disk` set, the node runs in a mount namespace of
its own where `disk` is bind-mounted on `MODELS_MOUNT`, its models directory. Every node then names
the same path and sees only its own files there, so a store that would hardlink from a host's
folder on a shared filesystem copies over the network, as between two machines.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from .netns import Netns
from .nodes import NodeProcess

MODELS_MOUNT = "/srv/skulk-lan-models"  # each node's own disk, in its own mount namespace


@dataclass
class LanNode(NodeProcess):
    netns: Netns | None = None
    key: str | None = None
    disk: Path | None = None  # this machine's models directory (bind-mounted on MODELS_MOUNT)

    @property
    def ns(self) -> Netns:
        assert self.netns is not None, "LanNode needs its namespace"
        return self.netns

    @property
    def url(self) -> str:
        return f"http://{self.ns.ns_ip}:{self.api_port}"

    @property
    def local_url(self) -> str:
        """The node's API on its own loopback (only reachable from inside its namespace)."""
        return f"http://127.0.0.1:{self.api_port}"

    def start(self) -> LanNode:
        self.home.mkdir(parents=True, exist_ok=True)
        self.log_path = self.home / "node.log"
        env = {**os.environ, "SKULK_HOME": str(self.home), "HF_HUB_OFFLINE": "1", **self.env}
        argv = ("run", "--profile", self.profile, "--api-port", str(self.api_port), "--api-host", "0.0.0.0")
        node = (sys.executable, "-m", "skulk_kernel.cli", *argv, *self.args)
        if self.disk is not None:
            self.disk.mkdir(parents=True, exist_ok=True)
            os.makedirs(MODELS_MOUNT, exist_ok=True)
            env["SKULK_MODELS_DIR"] = MODELS_MOUNT
            mount = f'mount --bind "$0" {MODELS_MOUNT} && exec "$@"'
            node = ("unshare", "--mount", "--propagation", "private", "sh", "-c", mount, str(self.disk), *node)
        cmd = self.ns.command(*node)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def _headers(self, kwargs: dict[str, Any]) -> dict[str, str]:
        headers = dict(kwargs.pop("headers", None) or {})
        if self.key and "authorization" not in {k.lower() for k in headers}:
            headers["authorization"] = f"Bearer {self.key}"
        return headers

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        headers = self._headers(kwargs)
        return httpx.get(self.url + path, headers=headers, timeout=kwargs.pop("timeout", 10), **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        headers = self._headers(kwargs)
        return httpx.post(self.url + path, headers=headers, timeout=kwargs.pop("timeout", 30), **kwargs)

    def delete(self, path: str, **kwargs: Any) -> httpx.Response:
        headers = self._headers(kwargs)
        return httpx.delete(self.url + path, headers=headers, timeout=kwargs.pop("timeout", 30), **kwargs)

    def local(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """(status, body) of a request from the node's own machine (no key needed)."""
        status, _, answer = self.ns.http(method, self.local_url + path, body=body)
        return status, answer

    def wait_api(self, timeout: float = 60) -> LanNode:
        self.wait_until(lambda: self.local("GET", "/node_id")[0] == 200, timeout, "the API (from its own host)")
        return self

    def node_id(self) -> str:
        status, body = self.local("GET", "/node_id")
        assert status == 200, body
        return str(body)

    def create_key(self, name: str, scope: str = "inference") -> dict[str, Any]:
        """A new API key, made on the node's own machine; the answer holds `key` and `id`."""
        status, body = self.local("POST", "/v1/keys", {"name": name, "scope": scope})
        assert status == 200, body
        return dict(body)
