"""Fake installed distributions: a `*.dist-info` folder (and optionally a module) on sys.path.

importlib.metadata finds distributions by scanning sys.path for `*.dist-info` folders, so a test
can "install" a plugin with any name, version, kernel range and entry point in a tmp folder,
without pip and without touching the environment:

    root = write_plugin_dist(tmp_path, "skulk-engine-future", "3.0.0", plugin="engine-future",
                             requires=["skulk-kernel>=9,<10"], module_source="...")
    monkeypatch.syspath_prepend(str(root))

The `fake_plugin` fixture of skulk_testing does both steps.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def write_plugin_dist(
    root: Path,
    distribution: str,
    version: str = "0.1.0",
    *,
    plugin: str | None = None,
    module: str | None = None,
    requires: Sequence[str] = ("skulk-kernel>=0.1,<0.2",),
    module_source: str | None = None,
    group: str = "skulk.plugins",
) -> Path:
    """Write `<root>/<dist>-<version>.dist-info` (and `<root>/<module>.py`); return `root`.

    plugin: the entry-point name (default: the distribution name without ``skulk-``).
    module: the entry point's module (default: the normalized distribution name).
    module_source: if given, the module is written with this source so the entry point loads.
    """
    root.mkdir(parents=True, exist_ok=True)
    plugin = plugin or distribution.removeprefix("skulk-")
    module = module or _normalize(distribution)
    info = root / f"{_normalize(distribution)}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    lines = ["Metadata-Version: 2.1", f"Name: {distribution}", f"Version: {version}"]
    lines += [f"Requires-Dist: {req}" for req in requires]
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{plugin} = {module}\n")
    (info / "RECORD").write_text("")
    if module_source is not None:
        (root / f"{module}.py").write_text(module_source)
    return root
