"""``skulk-kernel engines install vllm``: create the vLLM venv (the same code path the tests use)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any


def add_engines_command(cli: Any) -> None:
    engines = cli.add_parser("engines", help="install engines that live in their own environment")
    sub = engines.add_subparsers(dest="engines_command", required=True)
    install = sub.add_parser("install", help="create an engine's venv (vllm: ~3.4 GB for cpu)")
    install.add_argument("engine", choices=["vllm"])
    install.add_argument(
        "--flavor", choices=["auto", "cpu", "cuda"], default="auto", help="auto: cuda with an NVIDIA driver, else cpu"
    )
    install.set_defaults(func=cmd_install)
    status = sub.add_parser("status", help="which engine venvs are installed")
    status.set_defaults(func=cmd_status)


def cmd_install(args: argparse.Namespace) -> int:
    from .venv import VenvError, detect_flavor, ensure_vllm_venv, venv_dir

    flavor = detect_flavor() if args.flavor == "auto" else args.flavor
    started = time.monotonic()

    def say(message: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {message}", flush=True)

    say(f"vLLM ({flavor}) into {venv_dir(flavor)}")
    try:
        python = ensure_vllm_venv(flavor, say)
    except VenvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    say(f"done: {python}")
    return 0


def cmd_status(_args: argparse.Namespace) -> int:
    from .venv import installed_info, venv_dir

    for flavor in ("cpu", "cuda"):
        info = installed_info(flavor)
        state = f"vllm {info['vllm']}, torch {info['torch']}" if info else "not installed"
        print(f"vllm-{flavor:<5} {state:<40} {venv_dir(flavor)}")
    return 0
