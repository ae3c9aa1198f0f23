"""`skulk-kernel engines install comfyui`: a ComfyUI checkout and its own environment, where the
internet allows (ComfyUI is a repository, not a wheel; no package registry has it).

It clones a pinned commit of ComfyUI into `<home>/engines/comfyui/<commit>`, creates a venv there
and installs ComfyUI's requirements (torch among them: on NVIDIA install the CUDA wheels first, see
the README), building in a staging folder renamed into place only when everything succeeded, so a
half-finished install is never used. Then point the engine at it: `comfyui_root` and
`comfyui_python` in `[plugins.video-comfyui]` (or SKULK_COMFY_ROOT / SKULK_COMFY_BIN).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

REPOSITORY = "https://github.com/comfyanonymous/ComfyUI.git"
PINNED = "v0.3.64"  # the version whose protocol FACTS.md records


def checkout_commit(root: Path) -> str:
    """The checkout's commit (short), read from .git without running git; '' when unknown."""
    head = root / ".git" / "HEAD"
    try:
        ref = head.read_text().strip()
        if ref.startswith("ref: "):
            ref = (root / ".git" / ref[5:]).read_text().strip()
        return ref[:12]
    except OSError:
        return ""


def install(home: Path, ref: str, say: Any = print) -> Path:
    target = home / "engines" / "comfyui" / ref
    if (target / "main.py").is_file() and (target / ".venv").is_dir():
        say(f"already installed: {target}")
        return target
    staging = target.with_name(target.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)
    steps = [
        ["git", "clone", "--depth", "1", "--branch", ref, REPOSITORY, str(staging)],
        [sys.executable, "-m", "venv", str(staging / ".venv")],
        [str(staging / ".venv" / "bin" / "python"), "-m", "pip", "install", "-r", str(staging / "requirements.txt")],
    ]
    for argv in steps:
        say("$ " + " ".join(argv))
        if subprocess.run(argv, check=False).returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            raise RuntimeError(f"{argv[0]} failed; nothing was installed (is the internet reachable?)")
    os.replace(staging, target)
    return target


class ComfyUIInstaller:
    """`skulk-kernel engines install comfyui [--ref TAG] [--home DIR]` and its `engines status` line."""

    name = "comfyui"
    help = "a ComfyUI checkout at a pinned version, with its own venv"

    def install(self, argv: list[str]) -> int:
        parser = argparse.ArgumentParser(prog="skulk-kernel engines install comfyui")
        parser.add_argument("--ref", default=PINNED, help=f"tag or branch to clone (default {PINNED})")
        parser.add_argument("--home", default=os.environ.get("SKULK_HOME", "~/.skulk"))
        return cmd_install(parser.parse_args(argv))

    def status(self) -> str:
        target = Path(os.environ.get("SKULK_HOME", "~/.skulk")).expanduser() / "engines" / "comfyui" / PINNED
        if not ((target / "main.py").is_file() and (target / ".venv").is_dir()):
            return f"{PINNED} not installed ({target})"
        return f"{PINNED} at {checkout_commit(target) or 'unknown commit'} ({target})"


def cmd_install(args: argparse.Namespace) -> int:
    try:
        root = install(Path(args.home).expanduser(), args.ref)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f'done. In [plugins.video-comfyui]: comfyui_root = "{root}", comfyui_python = "{root}/.venv/bin/python"')
    return 0
