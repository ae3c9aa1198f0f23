"""Test helpers: a registry made with the plugin's own CLI, served by a real HTTP server on loopback."""

from __future__ import annotations

import functools
import http.server
import shutil
import threading
from pathlib import Path

from skulk_registry_tuf.cli import add_registry_commands

CARD = """\
model_id = "{model_id}"
n_layers = 4
hidden_size = 64
tasks = ["TextGeneration"]
family = "llama"
context_length = 1024
storage_size = 1000
compatible_backends = ["echo-cpu"]

[source]
kind = "hub"
repo_id = "test-org/{name}"
revision = "0123456789abcdef0123456789abcdef01234567"
"""


def write_card(cards_dir: Path, name: str, model_id: str | None = None) -> Path:
    cards_dir.mkdir(parents=True, exist_ok=True)
    path = cards_dir / f"{name}.toml"
    path.write_text(CARD.format(model_id=model_id or f"registry-org/{name}", name=name))
    return path


def registry_cli(*argv: str) -> int:
    """`skulk-kernel registry ...` through the plugin's own argparse wiring."""
    import argparse

    parser = argparse.ArgumentParser(prog="skulk-kernel")
    add_registry_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    return int(args.func(args))


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        self.server.requests.append(self.path)  # type: ignore[attr-defined]


class LoopbackServer:
    """A static file server for a registry's repo/ on 127.0.0.1; stop() and start() keep the port."""

    def __init__(self, directory: Path, port: int = 0) -> None:
        self.directory = directory
        self.port = port
        self.requests: list[str] = []
        self._server: http.server.ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LoopbackServer:
        handler = functools.partial(_Quiet, directory=str(self.directory))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), handler)
        server.requests = self.requests  # type: ignore[attr-defined]
        self.port = server.server_address[1]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> LoopbackServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def snapshot_repo(registry: Path, into: Path) -> Path:
    """A copy of repo/ as it is now (to serve again later: a rollback)."""
    shutil.copytree(registry / "repo", into)
    return into


def restore_repo(saved: Path, registry: Path) -> None:
    shutil.rmtree(registry / "repo")
    shutil.copytree(saved, registry / "repo")


def tamper_card(registry: Path, name: str) -> Path:
    """Change the served bytes of every stored copy of a card file, keeping its signed metadata."""
    hit = None
    for stored in (registry / "repo" / "targets" / "cards").glob(f"*.{name}.toml"):
        stored.write_text(stored.read_text().replace("n_layers = 4", "n_layers = 5"))
        hit = stored
    assert hit is not None, f"no stored copy of {name}"
    return hit
