"""`skulk-kernel plugins`, `profile show`, `--version`: metadata only, never a plugin import.

Each test runs the real command in a subprocess, so the "nothing imported" checks see a fresh
interpreter rather than this test process (which has imported plenty).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from skulk_kernel.plugins import installed_plugins, kernel_version

HEAVY = ("torch", "mlx", "vllm", "llama_cpp", "zenoh", "libp2p", "fastapi", "uvicorn", "numpy")


def skulk(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the CLI: the installed console script when there is one, else `python -m`."""
    script = Path(sys.executable).with_name("skulk-kernel")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "skulk_kernel.cli"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})


def plugin_packages() -> set[str]:
    """Top-level import names of every installed plugin's entry-point module."""
    return {info.module.split(":")[0].split(".")[0] for info in installed_plugins().values()}


def test_plugins_are_listed_without_importing_any(tmp_path: Path) -> None:
    packages = plugin_packages()
    assert "skulk_engine_echo" in packages
    probe = (
        "import json, sys\n"
        "from skulk_kernel.plugins import installed_plugins\n"
        "from skulk_kernel import cli\n"
        "found = installed_plugins()\n"
        "rc = cli.main(['plugins'])\n"
        "rc += cli.main(['profile', 'show', 'dev']) * 0\n"
        "print('@@' + json.dumps({'found': sorted(found), 'rc': rc,\n"
        "                         'modules': sorted(m.split('.')[0] for m in sys.modules)}))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    report = json.loads(out.stdout.split("@@", 1)[1])
    assert report["rc"] == 0
    assert "engine-echo" in report["found"]
    imported = set(report["modules"])
    assert "skulk_kernel" in imported  # the probe did run
    assert not imported & packages, f"listing imported plugin modules {sorted(imported & packages)}"
    assert not imported & set(HEAVY), f"listing imported heavy libraries {sorted(imported & set(HEAVY))}"


def test_plugins_lists_engine_echo_with_version_and_kernel_range() -> None:
    result = skulk("plugins")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"skulk-kernel {kernel_version()}"
    echo = next(line for line in lines if line.split()[:1] == ["engine-echo"])
    info = installed_plugins()["engine-echo"]
    assert info.distribution in echo and info.version in echo
    assert f"kernel{info.kernel_range}" in echo and "INCOMPATIBLE" not in echo
    for name in installed_plugins():  # every installed plugin has a line
        assert any(line.split()[:1] == [name] for line in lines), name


def test_plugins_json() -> None:
    result = skulk("plugins", "--json")
    assert result.returncode == 0, result.stderr
    listed = {p["name"]: p for p in json.loads(result.stdout)}
    assert set(listed) == set(installed_plugins())
    echo = listed["engine-echo"]
    assert echo["distribution"] == "skulk-engine-echo"
    assert echo["module"] == "skulk_engine_echo.plugin"
    assert echo["kernel_range"] and echo["compatible"] is True


def test_version() -> None:
    result = skulk("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"skulk-kernel {kernel_version()}"


def test_profile_show_dev() -> None:
    result = skulk("profile", "show", "dev")
    out = result.stdout
    assert out.startswith("profile dev (bundled:dev)")
    assert "deterministic echo engine" in out
    installed = installed_plugins()
    for name in ("master", "worker", "engine-echo", "store", "api-openai", "api-control"):
        line = next(line for line in out.splitlines() if line.split()[:1] == [name])
        if name in installed:
            assert f"{installed[name].distribution} {installed[name].version} (ok)" in line
        else:
            assert "MISSING: pip install" in line
    assert "planes:" in out
    for plane in ("control", "telemetry", "data"):
        assert f"  {plane:<10} local" in out
    missing = [
        n for n in ("master", "worker", "engine-echo", "store", "api-openai", "api-control") if n not in installed
    ]
    assert result.returncode == (1 if missing else 0)


def test_profile_show_user_profile_with_config(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(
        '[profile]\nname = "mine"\nplugins = ["engine-echo"]\n'
        '[planes]\ncontrol = "local"\ndata = "local"\n'
        "[plugins.engine-echo]\ntoken_delay_s = 0.01\n"
    )
    result = skulk("profile", "show", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"profile mine ({path})" in result.stdout
    assert '[engine-echo] {"token_delay_s": 0.01}' in result.stdout


def test_profile_list_shows_bundled_profiles() -> None:
    result = skulk("profile", "list")
    assert result.returncode == 0
    assert {"cpu-llamacpp", "cuda-vllm", "dev", "mac-mlx"} <= set(result.stdout.split())


def test_profile_show_missing_plugin_exits_nonzero_with_install_command(tmp_path: Path) -> None:
    path = tmp_path / "needs-more.toml"
    path.write_text('[profile]\nname = "needs-more"\nplugins = ["engine-echo", "video-nowhere"]\n')
    result = skulk("profile", "show", str(path))
    assert result.returncode != 0
    assert "video-nowhere" in result.stdout and "MISSING: pip install skulk-video-nowhere" in result.stdout


def test_run_with_missing_plugin_exits_nonzero_with_install_command(tmp_path: Path) -> None:
    path = tmp_path / "needs-more.toml"
    path.write_text('[profile]\nname = "needs-more"\nplugins = ["engine-echo", "video-nowhere"]\n')
    result = skulk("run", "--profile", str(path), "--no-api", "--home", str(tmp_path / "home"))
    assert result.returncode != 0
    assert "error:" in result.stderr
    assert "'video-nowhere'" in result.stderr and "pip install skulk-video-nowhere" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("not toml [", "not valid TOML"),
        ('[planes]\ncontrol = "local"\n', "missing the [profile] table"),
        ('[profile]\nname = "x"\nplugins = []\n[plugin.engine-echo]\n', "unknown tables"),
    ],
)
def test_bad_profiles_are_explained(tmp_path: Path, content: str, needle: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(content)
    result = skulk("profile", "show", str(path))
    assert result.returncode == 2
    assert needle in result.stderr and "Traceback" not in result.stderr


def test_unknown_bundled_profile_lists_the_bundled_ones() -> None:
    result = skulk("profile", "show", "no-such-profile")
    assert result.returncode == 2
    assert "no bundled profile named 'no-such-profile'" in result.stderr
    assert "dev" in result.stderr
