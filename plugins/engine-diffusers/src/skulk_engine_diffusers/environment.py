"""Where torch and diffusers come from: the node's own environment, or a cached overlay made once.

Why an overlay and not a dependency: the CPU torch wheel alone is about 190 MB (800 MB installed),
and most nodes never render an image, so `./skulk setup` must not install it for everyone. Why not
a separate venv with a server in it (the vLLM pattern): the diffusers pipeline runs *inside* the
runner subprocess, which calls it step by step (a progress chunk per denoising step, cancellation
between steps) with no second process and no extra hop for the image bytes. So the overlay is a
plain `pip install --target` folder, built with the node's own interpreter (same ABI) and pinned,
through a constraints file, to the versions of every package the node already has (numpy,
transformers, tokenizers, huggingface_hub ...), so the two never disagree. The runner appends it
to `sys.path` in `load()` (`activate`); the node process itself never imports torch.

`ensure_diffusers_env()` is the one code path: `skulk-kernel engines install diffusers` and the
test fixtures both call it. A marker file written last says the overlay is complete; a lock file
serialises creation so several nodes (and test sessions) on one host share one overlay. A node that
already has torch and diffusers installed (an operator's GPU build, `pip install
skulk-engine-diffusers[torch]`) needs no overlay at all.

Only CPU torch is ever installed here (`torch==2.13.0`, the wheel on this disk); on a GPU node the
operator installs the CUDA torch that matches the driver into the node's environment.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

Progress = Callable[[str], None]

TORCH = "torch==2.13.0"
DIFFUSERS = "diffusers==0.42.1"
PACKAGES = (TORCH, DIFFUSERS, "transformers>=4.40", "pillow>=10")
MARKER = ".skulk-diffusers-ready.json"
RECIPE = 1  # bump when PACKAGES change, so an overlay built from an older recipe is rebuilt
TOOLING = {"pip", "setuptools", "wheel"}  # build tools, never imported at run time: not pinned


class DiffusersEnvError(RuntimeError):
    """The overlay could not be made (the message names the step and pip's last lines)."""


def _quiet(_message: str) -> None:
    return None


def env_dir() -> Path:
    """``$SKULK_DIFFUSERS_ENV``, else ``~/.cache/skulk/diffusers-cpu-py3XX`` (one per Python minor)."""
    configured = os.environ.get("SKULK_DIFFUSERS_ENV")
    if configured:
        return Path(configured).expanduser()
    tag = f"py{sys.version_info.major}{sys.version_info.minor}"
    return Path.home() / ".cache" / "skulk" / f"diffusers-cpu-{tag}"


def native() -> bool:
    """torch and diffusers are importable without the overlay (installed in the node's environment).

    A module found inside the overlay does not count: once a process has put the overlay on its
    path (a test, or `activate`), the overlay must still be reported as what provides them.
    """
    overlay = env_dir().resolve()
    for name in ("torch", "diffusers", "PIL"):
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None or Path(spec.origin).resolve().is_relative_to(overlay):
            return False
    return True


def overlay_info() -> dict[str, str] | None:
    """What the marker of a complete overlay recorded (versions), or None (not made yet)."""
    marker = env_dir() / MARKER
    try:
        info = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    if info.get("recipe") != RECIPE:
        return None
    return {str(k): str(v) for k, v in info.items()}


def available() -> bool:
    return native() or overlay_info() is not None


def activate() -> None:
    """Make torch/diffusers importable in this process (the runner): the overlay goes last on sys.path,
    so every package the node already has keeps its own (identical, pinned) version."""
    if native():
        return
    if overlay_info() is None:
        raise DiffusersEnvError(
            f"torch and diffusers are not installed and there is no overlay at {env_dir()}; "
            "run `skulk-kernel engines install diffusers`"
        )
    site = str(env_dir())
    if site not in sys.path:
        sys.path.append(site)
    importlib.invalidate_caches()


def torch_version() -> str:
    """The torch this node would run, without importing it ('' when none)."""
    info = overlay_info()
    if not native() and info is not None:
        return info.get("torch", "")
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return ""


def _constraints() -> str:
    """`name==version` for every distribution of the running environment (ours excepted)."""
    lines = []
    for dist in metadata.distributions():
        name = dist.metadata["Name"] or ""
        if not name or name.lower().startswith("skulk") or dist.read_text("direct_url.json"):
            continue  # our own editable plugins, and local installs, are not index packages
        if name.lower() in TOOLING:
            continue
        lines.append(f"{name}=={dist.version}")
    return "\n".join(sorted(set(lines))) + "\n"


def _run(cmd: list[str], timeout_s: float, what: str) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DiffusersEnvError(f"{what} failed: {exc}") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-8:]
        raise DiffusersEnvError(f"{what} failed (exit {proc.returncode}): " + " | ".join(tail))


def ensure_diffusers_env(progress: Progress = _quiet, timeout_s: float = 1800.0) -> Path | None:
    """The overlay folder, made once (None when the node's environment already has everything)."""
    if native():
        return None
    root = env_dir()
    if overlay_info() is not None:
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.with_name(root.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if overlay_info() is not None:
            return root
        return _create(root, progress, timeout_s)


def _create(root: Path, progress: Progress, timeout_s: float) -> Path:
    """pip install --target is idempotent enough with --upgrade; the marker is written only at the end."""
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as handle:
        handle.write(_constraints())
        constraints = handle.name
    try:
        progress(f"pip install --target {root} " + " ".join(PACKAGES) + " (CPU torch; about 800 MB)")
        cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "-q"]
        cmd += ["--upgrade", "--target", str(root), "-c", constraints, *PACKAGES]
        _run(cmd, timeout_s, "pip install torch diffusers")
    finally:
        os.unlink(constraints)
    progress("checking that torch and diffusers import from the overlay")
    probe = (
        f"import sys, json; sys.path.append({str(root)!r}); import torch, diffusers, PIL; "
        "print(json.dumps({'torch': torch.__version__, 'diffusers': diffusers.__version__, "
        "'pillow': PIL.__version__}))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise DiffusersEnvError("importing torch and diffusers from the new overlay failed: " + out.stderr[-800:])
    versions = json.loads(out.stdout.strip().splitlines()[-1])
    (root / MARKER).write_text(json.dumps({"recipe": RECIPE, **versions}) + "\n")
    progress(f"ready: torch {versions['torch']}, diffusers {versions['diffusers']}")
    return root


class DiffusersInstaller:
    """`skulk-kernel engines install diffusers`: the overlay with torch (CPU) and diffusers."""

    name = "diffusers"
    help = "torch (CPU) + diffusers in a cached overlay (~1.3 GB)"

    def install(self, argv: list[str]) -> int:
        if argv:
            print(f"error: `engines install diffusers` takes no options (got {' '.join(argv)})", file=sys.stderr)
            return 2
        return main()

    def status(self) -> str:
        if native():
            return f"torch {torch_version()} in this environment"
        info = overlay_info()
        return (
            f"torch {info.get('torch')}, diffusers {info.get('diffusers')} ({env_dir()})"
            if info
            else f"not installed ({env_dir()})"
        )


def main() -> int:
    """`skulk-kernel engines install diffusers` (or `python -m skulk_engine_diffusers.environment`): make the
    overlay, by the same path the tests use."""
    import time

    started = time.monotonic()

    def say(message: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {message}", flush=True)

    try:
        where = ensure_diffusers_env(say)
    except DiffusersEnvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    say(f"done: {where or 'torch and diffusers are already in this environment'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
