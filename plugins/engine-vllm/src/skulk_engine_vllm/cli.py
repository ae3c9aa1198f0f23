"""``skulk-kernel engines install vllm``: create the vLLM venv (the same code path the tests use)."""

from __future__ import annotations

import argparse
import sys
import time


class VllmInstaller:
    """`skulk-kernel engines install vllm [--flavor auto|cpu|cuda]` and its line in `engines status`."""

    name = "vllm"
    help = "vLLM in its own venv (~3.4 GB for cpu)"

    def install(self, argv: list[str]) -> int:
        parser = argparse.ArgumentParser(prog="skulk-kernel engines install vllm")
        parser.add_argument(
            "--flavor",
            choices=["auto", "cpu", "cuda"],
            default="auto",
            help="auto: cuda with an NVIDIA driver, else cpu",
        )
        return cmd_install(parser.parse_args(argv))

    def status(self) -> str:
        from .venv import installed_info, venv_dir

        lines = []
        for flavor in ("cpu", "cuda"):
            info = installed_info(flavor)
            state = f"vllm {info['vllm']}, torch {info['torch']}" if info else "not installed"
            lines.append(f"{flavor}: {state} ({venv_dir(flavor)})")
        return "; ".join(lines)


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
