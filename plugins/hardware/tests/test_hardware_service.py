"""`skulk-kernel service`: the unit it writes validates, uninstall leaves nothing behind ([hosts] 6)."""

from __future__ import annotations

import os
import plistlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from skulk_hardware.service import (
    ServiceError,
    ServiceSpec,
    install,
    node_command,
    read_manifest,
    render,
    status,
    uninstall,
)

CLI = [sys.executable, "-m", "skulk_kernel.cli", "service"]


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "home" / "cfg")}


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=_env(tmp_path), capture_output=True, text=True, timeout=120)


def _verify(unit: Path) -> None:
    """systemd's own parser: exit 0 and no complaint about our file (it warns and exits 0 on bad keys)."""
    if shutil.which("systemd-analyze") is None:
        return
    done = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    complaints = [line for line in done.stderr.splitlines() if unit.name in line]
    assert done.returncode == 0 and not complaints, done.stderr


def _files(root: Path) -> list[Path]:
    return sorted(root.rglob("*")) if root.exists() else []


@pytest.mark.skipif(sys.platform == "darwin", reason="the Linux path (systemd)")
def test_install_prints_and_writes_a_unit_that_verifies_and_uninstall_leaves_nothing(tmp_path):
    home, data = tmp_path / "home", tmp_path / "node data %1"
    home.mkdir()
    dry = _cli(tmp_path, "install", "--home", str(data), "--profile", "dev", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "OOMPolicy=continue" in dry.stdout and "Restart=on-failure" in dry.stdout
    assert _files(home) == [] and not data.exists(), "--dry-run wrote something"

    done = _cli(tmp_path, "install", "--home", str(data), "--profile", "dev", "--api-port", "52999")
    assert done.returncode == 0, done.stderr
    unit = home / "cfg" / "systemd" / "user" / "skulk.service"
    assert f"# {unit}" in done.stdout
    text = unit.read_text()
    assert text in done.stdout, "the exact file written is printed"
    exec_start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    assert exec_start.startswith(f"ExecStart={node_command()[0]} run --profile dev --home ")
    assert '"' + str(data).replace("%", "%%") + '"' in exec_start and "--api-port 52999" in exec_start
    _verify(unit)
    assert "as written" in _cli(tmp_path, "status", "--home", str(data)).stdout

    gone = _cli(tmp_path, "uninstall", "--home", str(data))
    assert gone.returncode == 0, gone.stderr
    assert _files(home) == [] and not data.exists(), _files(tmp_path)
    assert "not installed" in _cli(tmp_path, "status", "--home", str(data)).stdout


def test_uninstall_removes_only_what_it_wrote(tmp_path):
    data, target = tmp_path / "data", tmp_path / "cfg" / "systemd" / "user" / "skulk.service"
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "mine.txt").write_text("the operator's")
    spec = ServiceSpec(kind="systemd-user", profile="dev", home=data, command=("/bin/true",))
    install(spec, target)
    assert set(read_manifest(data).created_dirs) == {target.parent, target.parent.parent, data}  # type: ignore[union-attr]
    (data / "node.log").write_text("the node's data")  # the data directory is not ours to remove once used
    target.write_text(target.read_text() + "# edited by hand\n")
    assert "edited since written" in "\n".join(status(data))
    with pytest.raises(ServiceError, match="edited"):
        uninstall(data)
    uninstall(data, force=True)
    assert not target.exists() and not target.parent.parent.exists()
    assert (tmp_path / "cfg" / "mine.txt").exists() and (data / "node.log").exists()


def test_install_refuses_a_file_it_did_not_write(tmp_path):
    target = tmp_path / "skulk.service"
    target.write_text("[Unit]\n")
    spec = ServiceSpec(kind="systemd-user", profile="dev", home=tmp_path / "data", command=("/bin/true",))
    with pytest.raises(ServiceError, match="not written by skulk"):
        install(spec, target)
    assert target.read_text() == "[Unit]\n"


def test_system_unit_names_the_user_and_verifies(tmp_path):
    spec = ServiceSpec(
        kind="systemd-system", profile="cpu-llamacpp", home=tmp_path, command=node_command(), run_as="root"
    )
    text = render(spec)
    assert "User=root" in text and "WantedBy=multi-user.target" in text and "OOMPolicy=continue" in text
    unit = tmp_path / "skulk.service"
    unit.write_text(text)
    _verify(unit)


def test_enable_runs_systemctl_and_uninstall_disables(tmp_path):
    calls: list[list[str]] = []
    spec = ServiceSpec(kind="systemd-user", profile="dev", home=tmp_path / "d", command=("/bin/true",))
    manifest = install(spec, tmp_path / "u" / "skulk.service", enable=True, runner=lambda a: calls.append(a) or 0)
    assert manifest.enabled and calls[-1] == ["systemctl", "--user", "enable", "--now", "skulk.service"]
    uninstall(tmp_path / "d", runner=lambda a: calls.append(a) or 0)
    assert calls[-1] == ["systemctl", "--user", "disable", "--now", "skulk.service"]


def test_launchd_agent_parses_and_restarts_on_failure(tmp_path):
    spec = ServiceSpec(kind="launchd", profile="mac-mlx", home=tmp_path / "data", command=("/venv/bin/skulk-kernel",))
    agent = plistlib.loads(render(spec).encode())
    assert agent["Label"] == "dev.skulk.node" and agent["RunAtLoad"] is True
    assert agent["ProgramArguments"] == [
        "/venv/bin/skulk-kernel", "run", "--profile", "mac-mlx", "--home", str(tmp_path / "data")
    ]  # fmt: skip
    assert agent["KeepAlive"] == {"SuccessfulExit": False}
    assert agent["EnvironmentVariables"]["SKULK_HOME"] == str(tmp_path / "data")
    target = tmp_path / "Library" / "LaunchAgents" / "dev.skulk.node.plist"
    install(spec, target)
    assert plistlib.loads(target.read_bytes())["Label"] == "dev.skulk.node"
    uninstall(tmp_path / "data")
    assert _files(tmp_path) == []
