"""The dashboard's Vitest unit tests (store, SSE parsing, formatting, placement previews), in CI."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from .conftest import DASHBOARD


def test_vitest_unit_tests_pass(node_modules: Path) -> None:
    done = subprocess.run(
        [shutil.which("npx") or "npx", "vitest", "run", "--reporter=dot"],
        cwd=DASHBOARD,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
