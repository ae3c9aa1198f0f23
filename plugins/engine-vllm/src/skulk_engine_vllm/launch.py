"""Exec a managed server so that it dies with the runner that started it (standard library only).

    python launch.py <owner_pid> <program> [args...]

Why a launcher and not ``preexec_fn``: the runner is multi-threaded, where ``preexec_fn`` may
deadlock. This script runs in the fresh child, asks the kernel to send SIGTERM when its parent
dies (``PR_SET_PDEATHSIG``, kept across ``execve``), checks the parent did not die in between,
and replaces itself with the server. The server's process group (``start_new_session``) and the
pid file still cover what this cannot (the server's own children; non-Linux hosts).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> None:
    owner = int(argv[1])
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != owner:  # the owner died before prctl took effect
        sys.exit(3)
    os.execvp(argv[2], argv[2:])


if __name__ == "__main__":
    main(sys.argv)
