"""The ComfyUI server a video runner manages: a loopback subprocess in its own process group.

ComfyUI ships as a repository, not a wheel, so the operator points the engine at a checkout
(`comfyui_root`, with `main.py`) and the interpreter of its environment (`comfyui_python`). The
server is started headless on 127.0.0.1 and a free port, with custom nodes and API nodes disabled
(an operator's node packs can never change what a card renders) and with Skulk's own input, output,
temp and user folders under the runner's work folder. It runs in a new session (its own process
group), and on Linux it gets SIGTERM when the runner that started it dies, so a killed runner leaves
no server behind; `stop()` signals the whole group, then kills it.

`server_command` replaces the launch line entirely (placeholders `{python}`, `{root}`, `{port}`,
`{input_dir}`, `{output_dir}`, `{temp_dir}`, `{user_dir}`): for a wrapper script, or a protocol
server in tests.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


class ServerError(RuntimeError):
    """The server would not start, or died; the message carries the reason and its log's tail."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """In the child before exec: a new session, and SIGTERM when the runner goes (Linux)."""
    os.setsid()
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(Exception):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class ComfyServer:
    work_dir: Path
    python: str = sys.executable
    root: Path | None = None
    server_command: list[str] = field(default_factory=list)
    extra_args: list[str] = field(default_factory=list)
    port: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def input_dir(self) -> Path:
        return self.work_dir / "input"

    @property
    def output_dir(self) -> Path:
        return self.work_dir / "output"

    @property
    def log_path(self) -> Path:
        return self.work_dir / "comfyui.log"

    def command(self) -> list[str]:
        values = {
            "python": self.python,
            "root": str(self.root or ""),
            "port": str(self.port),
            "input_dir": str(self.input_dir),
            "output_dir": str(self.output_dir),
            "temp_dir": str(self.work_dir / "temp"),
            "user_dir": str(self.work_dir / "user"),
        }
        if self.server_command:
            return [part.format(**values) for part in self.server_command] + list(self.extra_args)
        if self.root is None or not (self.root / "main.py").is_file():
            raise ServerError(f"no ComfyUI checkout at {self.root} (main.py missing); set comfyui_root")
        return [
            self.python,
            str(self.root / "main.py"),
            "--listen",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--disable-all-custom-nodes",
            "--disable-api-nodes",
            "--dont-print-server",
            "--input-directory",
            values["input_dir"],
            "--output-directory",
            values["output_dir"],
            "--temp-directory",
            values["temp_dir"],
            "--user-directory",
            values["user_dir"],
            *self.extra_args,
        ]

    def start(self, timeout_s: float = 120.0) -> None:
        """Start the server and wait until it answers GET /system_stats (or fail with its log)."""
        import httpx

        for sub in ("input", "output", "temp", "user"):
            (self.work_dir / sub).mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        argv = self.command()
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                argv,
                cwd=str(self.root or self.work_dir),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerError(f"ComfyUI exited with code {self.process.returncode} at start: {self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/system_stats", timeout=2.0, trust_env=False).status_code == 200:
                    return
            time.sleep(0.1)
        self.stop()
        raise ServerError(f"ComfyUI did not answer within {timeout_s:.0f}s: {self.log_tail()}")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def exited_within(self, timeout_s: float) -> bool:
        """True once the process has exited (waiting up to `timeout_s`): a broken socket is often
        the first sign of a dying server, a moment before the process is gone."""
        if self.process is None:
            return True
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def exit_reason(self) -> str:
        code = self.process.returncode if self.process is not None else None
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        return f"the ComfyUI server {how}; its log ends: {self.log_tail()}"

    def log_tail(self, limit: int = 600) -> str:
        try:
            text = self.log_path.read_bytes()[-limit:].decode(errors="replace").strip()
        except OSError:
            return "(no log)"
        return text or "(empty log)"

    def stop(self, grace_s: float = 5.0) -> None:
        """Signal the whole process group (TERM, then KILL); idempotent."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(5.0)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # whatever the server itself left in its group
        self.process = None
