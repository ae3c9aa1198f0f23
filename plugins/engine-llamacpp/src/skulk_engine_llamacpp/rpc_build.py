"""llama.cpp with its RPC backend: ``ggml-rpc-server`` and an RPC-driving ``llama-server``, built once.

Why from source: no package on PyPI ships an RPC-enabled llama.cpp (xllamacpp's ``CommonParams`` has
no RPC field, llama-cpp-python ignores ``rpc_servers``), but llama-cpp-python's sdist vendors
llama.cpp's whole tree at one pinned revision. Every node builds that same revision
(``LLAMA_CPP_PYTHON`` pins it), so the ranks of one instance speak one RPC protocol; the identity
of a build (revision, RPC protocol version, options, binaries' digest) is written beside the
binaries and advertised in telemetry, and the planner never groups nodes whose revision or
protocol differ (``group_key``). A GPU build (``--gpu cuda``, ``rocm``, ``vulkan``, ``metal``) adds
its backend's switch; a Mac and a Linux GPU box then share one GGUF through the same protocol.

Where: ``$SKULK_LLAMACPP_RPC_DIR`` if set, else ``~/.cache/skulk/llamacpp-rpc/<version>-<gpu>``,
outside the repository and shared by every node of the user (and by the tests). A lock serialises
the build and a marker written last (``build.json``) says it is complete; a half-built directory is
built again. About ten minutes on two cores, once.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

LLAMA_CPP_PYTHON = "0.3.36"  # the sdist whose vendored llama.cpp every node builds
SERVER, RPC_SERVER = "llama-server", "ggml-rpc-server"
MARKER = "build.json"
ENV_DIR = "SKULK_LLAMACPP_RPC_DIR"
GPU_FLAGS = {
    "cpu": (),
    "cuda": ("-DGGML_CUDA=ON",),
    "rocm": ("-DGGML_HIP=ON",),
    "vulkan": ("-DGGML_VULKAN=ON",),
    "metal": ("-DGGML_METAL=ON",),
}
#: static binaries, no web UI, nothing fetched at configure time (the machines may be offline)
BASE_FLAGS = (
    "-DGGML_RPC=ON",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DCMAKE_BUILD_TYPE=Release",
)

Progress = Callable[[str], None]


class RpcBuildError(RuntimeError):
    """The build could not be made or is unusable; the message says which step and why."""


@dataclass(frozen=True)
class RpcBuild:
    """One complete build, as its marker describes it."""

    directory: str
    source: str  # "llama-cpp-python 0.3.36"
    revision: str  # llama.cpp's commit, short
    protocol: str  # the RPC protocol version ("7.0.0"): ranks must agree on it
    compute: str  # cpu, cuda, rocm, vulkan, metal
    options: tuple[str, ...]
    digest: str  # sha256 over both binaries
    built_s: float = 0.0

    @property
    def server(self) -> Path:
        return Path(self.directory) / "bin" / SERVER

    @property
    def rpc_server(self) -> Path:
        return Path(self.directory) / "bin" / RPC_SERVER

    @property
    def group_key(self) -> str:
        """What ranks of one instance must share: one llama.cpp revision and RPC protocol. The compute
        backend and the binaries' digest may differ (a Metal Mac beside a CUDA box)."""
        return f"llama.cpp {self.revision} (RPC protocol {self.protocol})"

    def describe(self) -> str:
        return f"{self.group_key}, {self.compute} build, sha256 {self.digest[:12]}"


def build_dir(gpu: str = "cpu") -> Path:
    configured = os.environ.get(ENV_DIR)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "skulk" / "llamacpp-rpc" / f"{LLAMA_CPP_PYTHON}-{gpu}"


def find_build(directory: Path | None = None) -> RpcBuild | None:
    """The complete build in `directory` (default: the configured CPU one), or None."""
    directory = directory or build_dir()
    try:
        data = json.loads((directory / MARKER).read_text())
        build = RpcBuild(**{**data, "directory": str(directory), "options": tuple(data.get("options", ()))})
    except (OSError, ValueError, TypeError):
        return None
    if not (build.server.is_file() and build.rpc_server.is_file()):
        return None
    return build


def _digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for path in paths:
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def _protocol(source: Path) -> str:
    header = (source / "ggml" / "include" / "ggml-rpc.h").read_text()
    parts = [re.search(rf"RPC_PROTO_{p}_VERSION\s+(\d+)", header) for p in ("MAJOR", "MINOR", "PATCH")]
    if not all(parts):
        raise RpcBuildError("ggml-rpc.h names no RPC protocol version: not an RPC-capable llama.cpp")
    return ".".join(m.group(1) for m in parts if m)


def _revision(source: Path) -> str:
    done = subprocess.run(["git", "-C", str(source), "log", "-1", "--format=%h"], capture_output=True, text=True)
    if done.returncode == 0 and done.stdout.strip():
        return done.stdout.strip()
    return f"llama-cpp-python-{LLAMA_CPP_PYTHON}"  # no git metadata: the pinned sdist names it


def _run(cmd: list[str], progress: Progress, cwd: Path | None = None, timeout_s: float = 3600.0) -> None:
    progress("$ " + " ".join(cmd))
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-1500:]
        raise RpcBuildError(f"{' '.join(cmd[:4])} ... failed (exit {done.returncode}):\n{tail}")


def _sdist(cache: Path, progress: Progress) -> Path:
    found = sorted(cache.glob(f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"))
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    _run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
         f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(cache)],
        progress,
    )  # fmt: skip
    found = sorted(cache.glob(f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"))
    if not found:
        raise RpcBuildError(f"pip downloaded no llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz into {cache}")
    return found[0]


def _extract(sdist: Path, into: Path) -> Path:
    with tarfile.open(sdist) as tar:
        tar.extractall(into, filter="fully_trusted")  # our pinned sdist, from the package index
    sources = list(into.glob("*/vendor/llama.cpp"))
    if not sources:
        raise RpcBuildError(f"{sdist.name} carries no vendor/llama.cpp")
    return sources[0]


def ensure_rpc_build(
    gpu: str = "cpu", progress: Progress = lambda _m: None, jobs: int | None = None, timeout_s: float = 3600.0
) -> RpcBuild:
    """The build for `gpu`, made once (idempotent; concurrent callers wait on one lock)."""
    if gpu not in GPU_FLAGS:
        raise RpcBuildError(f"unknown --gpu {gpu!r}: one of {', '.join(GPU_FLAGS)}")
    target = build_dir(gpu)
    if (ready := find_build(target)) is not None:
        return ready
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (ready := find_build(target)) is not None:
            return ready
        started = time.monotonic()
        sdist = _sdist(Path.home() / ".cache" / "skulk" / "llamacpp-rpc" / "src", progress)  # shared by builds
        with tempfile.TemporaryDirectory(prefix="skulk-rpc-build-") as tmp:
            source = _extract(sdist, Path(tmp))
            options = (*BASE_FLAGS, *GPU_FLAGS[gpu])
            build = Path(tmp) / "build"
            _run(["cmake", "-S", str(source), "-B", str(build), *options], progress, timeout_s=600)
            _run(
                [
                    "cmake",
                    "--build",
                    str(build),
                    "--target",
                    RPC_SERVER,
                    SERVER,
                    "-j",
                    str(jobs or os.cpu_count() or 2),
                ],
                progress,
                timeout_s=timeout_s,
            )
            shutil.rmtree(target, ignore_errors=True)
            (target / "bin").mkdir(parents=True)
            for name in (SERVER, RPC_SERVER):
                shutil.copy2(build / "bin" / name, target / "bin" / name)
            made = RpcBuild(
                directory=str(target),
                source=f"llama-cpp-python {LLAMA_CPP_PYTHON}",
                revision=_revision(source),
                protocol=_protocol(source),
                compute=gpu,
                options=options,
                digest=_digest(target / "bin" / SERVER, target / "bin" / RPC_SERVER),
                built_s=round(time.monotonic() - started, 1),
            )
        fields = {k: v for k, v in asdict(made).items() if k != "directory"}
        (target / MARKER).write_text(json.dumps(fields, indent=2) + "\n")
        progress(f"built {made.describe()} in {made.built_s:.0f} s: {target}")
        return made


class RpcInstaller:
    """``skulk-kernel engines install llamacpp-rpc [--gpu cuda] [--jobs N] [--dry-run]``."""

    name = "llamacpp-rpc"
    help = "llama.cpp's RPC server and RPC-driving server, built from the pinned source (about 10 min, once)"

    def install(self, argv: list[str]) -> int:
        import argparse

        parser = argparse.ArgumentParser(prog=f"skulk-kernel engines install {self.name}")
        parser.add_argument("--gpu", choices=sorted(GPU_FLAGS), default="cpu", help="the build's compute backend")
        parser.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: every core)")
        parser.add_argument("--dry-run", action="store_true", help="say what would be built, build nothing")
        args = parser.parse_args(argv)
        target = build_dir(args.gpu)
        if (ready := find_build(target)) is not None:
            print(f"installed: {ready.describe()} in {target}")
            return 0
        flags = " ".join((*BASE_FLAGS, *GPU_FLAGS[args.gpu]))
        print(f"{self.name}: llama-cpp-python {LLAMA_CPP_PYTHON}'s llama.cpp with {flags}")
        print(f"into {target}", flush=True)
        if args.dry_run:
            return 0
        try:
            made = ensure_rpc_build(args.gpu, lambda m: print(m, flush=True), jobs=args.jobs)
        except (RpcBuildError, OSError, subprocess.SubprocessError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"installed: {made.describe()}; restart the node: it advertises llama_rpc-{made.compute}", flush=True)
        return 0

    def status(self) -> str:
        build = find_build()
        return f"installed ({build.describe()})" if build is not None else "not installed"
