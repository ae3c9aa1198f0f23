"""The dashboard page while `./skulk run` builds it beside the node: it says so (and reloads itself)
while the builder named in the marker lives; a marker left by a killed build is ignored."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from skulk_api_control.dashboard import BUILDING, building


def test_building_while_the_builder_lives_and_not_after(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    assert not building(dist)  # no marker
    marker = tmp_path / ".skulk-building"
    marker.write_text(f"{os.getpid()}\n")
    assert building(dist)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    marker.write_text(str(gone.pid))
    assert not building(dist)  # its builder was killed mid-build: the how-to-build page again
    marker.write_text("not a pid")
    assert not building(dist)
    assert 'http-equiv="refresh"' in BUILDING and "/docs" in BUILDING
