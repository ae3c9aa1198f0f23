"""What the dashboard tests need, installed once and cached: Chromium, the npm packages, a build.

- Chromium: Debian's package (`apt-get install chromium`) when /usr/bin/chromium is missing;
  Playwright's own browser download cannot work on these machines.
- npm packages: `npm ci` from the committed lock file when `dashboard/node_modules` is missing or
  was installed from another lock file (a hash of the lock file is kept beside it).
- A build of the current sources into a temporary folder, served through SKULK_DASHBOARD_DIR, so
  the tests never depend on (or overwrite) a `dashboard/dist` the operator built.

A test skips, with the reason, only when apt or npm is not there at all.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "dashboard"
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
LOCK_STAMP = DASHBOARD / "node_modules" / ".skulk-lock-sha256"


@dataclass(frozen=True)
class Dashboard:
    dist: Path
    chromium: Path
    artifacts: Path

    def node_env(self) -> dict[str, str]:
        return {"SKULK_DASHBOARD_DIR": str(self.dist)}


def _run(cmd: list[str], cwd: Path, timeout: float) -> None:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def ensure_chromium() -> Path:
    if CHROMIUM.exists():
        return CHROMIUM
    apt = shutil.which("apt-get")
    if apt is None:
        pytest.skip(f"{CHROMIUM} is missing and there is no apt-get to install Debian's chromium")
    sudo = [] if os.geteuid() == 0 else (["sudo", "-n"] if shutil.which("sudo") else None)
    if sudo is None:
        pytest.skip(f"{CHROMIUM} is missing and installing it needs root (apt-get install chromium)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run([*sudo, apt, "update", "-qq"], check=False, env=env, capture_output=True, timeout=300)
    done = subprocess.run(
        [*sudo, apt, "install", "-y", "-qq", "chromium"], env=env, capture_output=True, text=True, timeout=900
    )
    if done.returncode != 0 or not CHROMIUM.exists():
        raise RuntimeError(f"apt-get install chromium failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return CHROMIUM


@contextlib.contextmanager
def _installing() -> Iterator[None]:
    """One installer at a time: several dashboard modules run on parallel xdist workers, and two
    `npm ci` in one folder delete each other's node_modules (seen in CI: exit 217 and 1)."""
    import fcntl
    import tempfile

    tag = hashlib.sha256(str(DASHBOARD).encode()).hexdigest()[:12]
    with open(Path(tempfile.gettempdir()) / f"skulk-dashboard-{tag}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def ensure_node_modules() -> None:
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        pytest.skip("Node.js (node and npm) is not installed; the dashboard cannot be built")
    want = hashlib.sha256((DASHBOARD / "package-lock.json").read_bytes()).hexdigest()
    with _installing():
        if LOCK_STAMP.exists() and LOCK_STAMP.read_text().strip() == want:
            return
        _run([npm, "ci", "--no-audit", "--no-fund"], DASHBOARD, timeout=600)
        LOCK_STAMP.write_text(want)


@pytest.fixture(scope="session")
def node_modules() -> Path:
    ensure_node_modules()
    return DASHBOARD / "node_modules"


@pytest.fixture(scope="session")
def dashboard(node_modules: Path, tmp_path_factory: pytest.TempPathFactory) -> Dashboard:
    """Chromium present, packages installed, the current sources type-checked and built."""
    with _installing():
        chromium = ensure_chromium()
    dist = tmp_path_factory.mktemp("dashboard-dist")
    npx = shutil.which("npx") or "npx"
    _run([npx, "tsc", "--noEmit", "-p", "."], DASHBOARD, timeout=300)
    _run([npx, "vite", "build", "--outDir", str(dist), "--emptyOutDir", "--logLevel", "warn"], DASHBOARD, timeout=300)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return Dashboard(dist=dist, chromium=chromium, artifacts=ARTIFACTS)
