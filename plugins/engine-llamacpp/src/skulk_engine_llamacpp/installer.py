"""``skulk-kernel engines install llamacpp-cuda`` (``-rocm``, ``-vulkan``): llama.cpp's GPU build in the
node's own environment.

xllamacpp publishes one package name, ``xllamacpp``, in several builds: PyPI carries the CPU build
(Linux, Windows) and the Metal build (macOS); the CUDA, ROCm and Vulkan builds live on the project's
own package indexes, one per backend (its README, "Installation"):

    https://xorbitsai.github.io/xllamacpp/whl/cu128        CUDA 12.8 (driver CUDA >= 12.8)
    https://xorbitsai.github.io/xllamacpp/whl/cu132        CUDA 13.2 (driver CUDA >= 13.2)
    https://xorbitsai.github.io/xllamacpp/whl/rocm-6.4.1   ROCm 6.4.1
    https://xorbitsai.github.io/xllamacpp/whl/rocm-7.2.4   ROCm 7.2.4
    https://xorbitsai.github.io/xllamacpp/whl/vulkan       Vulkan

so the installer runs ``pip install --force-reinstall --no-deps --index-url <that index> xllamacpp``
into this Python (``--no-deps``: the package needs nothing, and an index URL that replaces PyPI must
not be asked for anything else). The GPU wheels need glibc >= 2.35 on Linux. llama-cpp-python has no
GPU wheels on PyPI; ``--llama-cpp-python`` rebuilds it from source with ``CMAKE_ARGS`` (the toolkit
must be installed). Before anything it checks the hardware, and refuses with the reason where the
build could not run (no NVIDIA GPU: the CPU build stays). ``--dry-run`` prints the commands only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

INDEX = "https://xorbitsai.github.io/xllamacpp/whl"
#: per backend: (variant, the index's path); the first variant the hardware allows wins
VARIANTS: dict[str, tuple[tuple[str, str], ...]] = {
    "cuda": (("13.2", "cu132"), ("12.8", "cu128")),
    "rocm": (("7.2.4", "rocm-7.2.4"), ("6.4.1", "rocm-6.4.1")),
    "vulkan": (("vulkan", "vulkan"),),
}
#: llama-cpp-python's source-build switch per backend
CMAKE_ARGS = {"cuda": "-DGGML_CUDA=on", "rocm": "-DGGML_HIP=on", "vulkan": "-DGGML_VULKAN=on"}

Run = Callable[..., subprocess.CompletedProcess[str]]


def _run(cmd: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=60, check=False)


@dataclass
class Host:
    """The hardware the installer reads; every source injectable (tests record machines we lack)."""

    run: Run = _run
    root: Path = Path("/")
    which: Callable[[str], str | None] = shutil.which

    def nvidia(self) -> tuple[list[str], str | None, str]:
        """(GPU lines of ``nvidia-smi -L``, the CUDA version the driver supports, why none)."""
        if self.which("nvidia-smi") is None:
            return [], None, "nvidia-smi is not installed"
        try:
            listed = self.run(["nvidia-smi", "-L"])
        except (OSError, subprocess.SubprocessError) as exc:
            return [], None, f"nvidia-smi -L failed: {exc}"
        gpus = [line for line in listed.stdout.splitlines() if line.startswith("GPU ")]
        if listed.returncode != 0 or not gpus:
            return [], None, f"nvidia-smi -L lists no GPU ({(listed.stderr or listed.stdout).strip()[:120] or 'empty'})"
        try:
            head = self.run(["nvidia-smi"]).stdout
        except (OSError, subprocess.SubprocessError):
            head = ""
        match = re.search(r"CUDA Version:\s*([0-9]+\.[0-9]+)", head)
        return gpus, match.group(1) if match else None, ""

    def amd(self) -> list[str]:
        """AMD GPUs with the ROCm kernel driver: /dev/kfd and a DRM card of vendor 0x1002."""
        if not (self.root / "dev" / "kfd").exists():
            return []
        cards = sorted((self.root / "sys" / "class" / "drm").glob("card*/device/vendor"))
        return [str(c.parent.parent.name) for c in cards if c.read_text().strip() == "0x1002"]

    def render_nodes(self) -> list[str]:
        return sorted(p.name for p in (self.root / "dev" / "dri").glob("renderD*"))


@dataclass
class Plan:
    """What an install would do, or why it will not."""

    backend: str
    refused: str = ""
    index_url: str = ""
    commands: list[list[str]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    found: str = ""


def _version(text: str | None) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in (text or "").split("."))
    except ValueError:
        return ()


def plan_install(
    backend: str,
    host: Host,
    *,
    variant: str | None = None,
    index_url: str | None = None,
    llama_cpp_python: bool = False,
) -> Plan:
    plan = Plan(backend)
    if backend == "cuda":
        gpus, cuda, why = host.nvidia()
        if not gpus:
            plan.refused = f"no NVIDIA GPU found ({why}); the CPU build stays"
            return plan
        plan.found = f"{len(gpus)} NVIDIA GPU(s), driver CUDA {cuda or '?'}: {gpus[0]}"
        usable = [v for v in VARIANTS["cuda"] if cuda is None or _version(cuda) >= _version(v[0])]
        if not usable and variant is None and index_url is None:
            plan.refused = (
                f"the NVIDIA driver supports CUDA {cuda}, the CUDA builds need 12.8 or newer: "
                "upgrade the driver; the CPU build stays"
            )
            return plan
    elif backend == "rocm":
        amd = host.amd()
        if not amd:
            plan.refused = (
                "no AMD GPU with the ROCm driver found (/dev/kfd and a DRM card of vendor 0x1002); the CPU build stays"
            )
            return plan
        plan.found = f"AMD GPU(s): {', '.join(amd)}"
        usable = list(VARIANTS["rocm"])
    elif backend == "vulkan":
        nodes = host.render_nodes()
        if not nodes:
            plan.refused = "no GPU render node (/dev/dri/renderD*) found for Vulkan; the CPU build stays"
            return plan
        plan.found = f"render nodes: {', '.join(nodes)}"
        usable = list(VARIANTS["vulkan"])
    else:
        plan.refused = f"unknown backend {backend!r}: cuda, rocm or vulkan"
        return plan
    chosen = dict(VARIANTS[backend]).get(variant or "") if variant else usable[0][1]
    if chosen is None:
        plan.refused = f"no {backend} build {variant!r}: {', '.join(v for v, _ in VARIANTS[backend])}"
        return plan
    plan.index_url = index_url or f"{INDEX}/{chosen}"
    pip = [sys.executable, "-m", "pip", "install"]
    plan.commands.append([*pip, "--force-reinstall", "--no-deps", "--index-url", plan.index_url, "xllamacpp"])
    if llama_cpp_python:
        plan.env = {"CMAKE_ARGS": CMAKE_ARGS[backend]}
        plan.commands.append(
            [*pip, "--force-reinstall", "--no-deps", "--no-binary", "llama-cpp-python", "llama-cpp-python"]
        )
    return plan


#: pip settings that would add other indexes to the GPU one (where a newer CPU wheel may win)
PIP_INDEX_ENV = ("PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL", "PIP_FIND_LINKS")


def pip_env(plan: Plan, cmd: list[str]) -> dict[str, str]:
    """xllamacpp from the GPU index alone (no pip configuration, no extra indexes); llama-cpp-python's
    source build with its CMAKE_ARGS."""
    if "llama-cpp-python" in cmd:
        return {**os.environ, **plan.env}
    env = {k: v for k, v in os.environ.items() if k not in PIP_INDEX_ENV}
    return {**env, "PIP_CONFIG_FILE": os.devnull}


def devices_check() -> list[str]:
    """The command that says which build is installed now and lists its devices (a fresh interpreter:
    the new build), as one JSON line."""
    code = (
        "import json; from skulk_engine_llamacpp.accel import detect_build; import xllamacpp as x; "
        "print(json.dumps({'build': detect_build('xllamacpp', 'xllamacpp'), "
        "'devices': [d['name'] + ': ' + d['description'] for d in x.get_device_info()]}))"
    )
    return [sys.executable, "-c", code]


def check_installed(backend: str, stdout: str, stderr: str) -> str:
    """'' when the new build is ``backend``'s and lists a device of it, else what went wrong."""
    try:
        seen = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return f"the new build does not load: {stderr.strip()[-300:] or stdout.strip()[-300:]}"
    if seen.get("build") != backend:
        return (
            f"pip installed a {seen.get('build')} build, not {backend}: check which index served it "
            "(pip -v) and pass --index-url"
        )
    gpu = [d for d in seen.get("devices", []) if not d.startswith("CPU")]
    if not gpu:
        devices = seen.get("devices")
        return f"the {backend} build lists no GPU device ({devices}): check the driver and the {backend} runtime"
    return ""


class LlamaCppInstaller:
    """One of `engines install llamacpp-cuda | llamacpp-rocm | llamacpp-vulkan`."""

    def __init__(self, backend: str, host: Host | None = None) -> None:
        self.backend = backend
        self.name = f"llamacpp-{backend}"
        self.help = f"llama.cpp's {backend} build (xllamacpp) into this environment"
        self.host = host or Host()

    def install(self, argv: list[str]) -> int:
        parser = argparse.ArgumentParser(prog=f"skulk-kernel engines install {self.name}")
        variants = [v for v, _ in VARIANTS[self.backend]]
        parser.add_argument("--variant", choices=variants, help=f"default: the newest the driver runs ({variants})")
        parser.add_argument("--index-url", help="another package index carrying the xllamacpp build")
        parser.add_argument("--llama-cpp-python", action="store_true", help="also rebuild llama-cpp-python from source")
        parser.add_argument("--dry-run", action="store_true", help="print the commands, install nothing")
        args = parser.parse_args(argv)
        plan = plan_install(
            self.backend,
            self.host,
            variant=args.variant,
            index_url=args.index_url,
            llama_cpp_python=args.llama_cpp_python,
        )
        if plan.refused:
            print(f"error: {plan.refused}", file=sys.stderr)
            return 1
        print(f"{self.name}: {plan.found}", flush=True)
        env_text = " ".join(f"{k}={v}" for k, v in plan.env.items())
        for cmd in plan.commands:
            print(f"$ {env_text + ' ' if env_text and 'llama-cpp-python' in cmd else ''}{' '.join(cmd)}", flush=True)
        if args.dry_run:
            return 0
        for cmd in plan.commands:
            done = subprocess.run(cmd, env=pip_env(plan, cmd), check=False)
            if done.returncode != 0:
                print(f"error: {' '.join(cmd[3:])} failed (exit {done.returncode})", file=sys.stderr)
                return 1
        listed = subprocess.run(devices_check(), capture_output=True, text=True, check=False)
        problem = check_installed(self.backend, listed.stdout, listed.stderr)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 1
        print(f"installed: {listed.stdout.strip().splitlines()[-1]}", flush=True)
        print(f"restart the node: it advertises llama_server-{self.backend} on this GPU", flush=True)
        return 0

    def status(self) -> str:
        from .engine import _version as installed
        from .engine import detect_build

        version = installed("xllamacpp", "xllamacpp")
        if version is None:
            return "xllamacpp is not installed"
        build = detect_build("xllamacpp", "xllamacpp")
        mark = "installed" if build == self.backend else "not installed"
        return f"{mark} (xllamacpp {version}, {build} build)"
