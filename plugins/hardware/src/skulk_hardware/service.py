"""A node that runs as a service: a systemd unit (Linux) or a launchd agent (macOS).

The hardware plugin owns "this machine" (detection, the doctor), so it owns how the machine keeps a
node running. Rendering is pure (a `ServiceSpec` in, file text out) so tests validate the output
without installing anything; `install` writes the file and a small manifest of what it wrote, so
`uninstall` removes exactly that and nothing an operator wrote or edited by hand.

Why `OOMPolicy=continue`: the kernel's OOM killer picks the biggest process, which is a model
runner, not the node. systemd's default (`stop`) would then stop the whole unit, node included;
with `continue` the node survives, sees its runner die and re-places the model.
"""

from __future__ import annotations

import hashlib
import os
import plistlib
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

SYSTEMD_UNIT = "skulk.service"
LAUNCHD_LABEL = "dev.skulk.node"
MANIFEST = "service-manifest.json"

Kind = Literal["systemd-user", "systemd-system", "launchd"]


class ServiceSpec(BaseModel):
    """What the service runs: one `skulk-kernel run` with the profile and data directory named."""

    model_config = ConfigDict(frozen=True)
    kind: Kind
    profile: str
    home: Path
    command: tuple[str, ...] = Field(description="the venv's skulk-kernel (or python -m skulk_kernel.cli)")
    extra_args: tuple[str, ...] = ()
    run_as: str | None = Field(default=None, description="User= of a system unit")

    def argv(self) -> list[str]:
        return [*self.command, "run", "--profile", self.profile, "--home", str(self.home), *self.extra_args]


class WrittenFile(BaseModel):
    path: Path
    sha256: str


class Manifest(BaseModel):
    """What `install` wrote (files with their digests, directories it created): all `uninstall` touches."""

    kind: Kind
    written_at: str
    files: list[WrittenFile] = []
    created_dirs: list[Path] = []
    enabled: bool = False


class Runner(Protocol):
    """Runs systemctl / launchctl; a test passes one that records instead."""

    def __call__(self, argv: list[str]) -> int: ...


def node_command() -> tuple[str, ...]:
    """The venv's `skulk-kernel` beside this interpreter, else this interpreter running the module."""
    script = Path(sys.executable).parent / "skulk-kernel"
    if script.is_file() and os.access(script, os.X_OK):
        return (str(script),)
    return (sys.executable, "-m", "skulk_kernel.cli")


def default_kind(system: bool) -> Kind:
    if sys.platform == "darwin":
        return "launchd"
    return "systemd-system" if system else "systemd-user"


def service_path(kind: Kind) -> Path:
    """Where each kind's file lives: the user's systemd or LaunchAgents folder, or /etc/systemd/system."""
    if kind == "systemd-system":
        return Path("/etc/systemd/system") / SYSTEMD_UNIT
    if kind == "launchd":
        return Path.home() / "Library" / "LaunchAgents" / f"{LAUNCHD_LABEL}.plist"
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "systemd" / "user" / SYSTEMD_UNIT


def _systemd_quote(arg: str) -> str:
    """One ExecStart word: `%` and `$` escaped (specifiers, variables), quoted when it has spaces."""
    arg = arg.replace("%", "%%").replace("$", "$$")
    if arg and not any(c in arg for c in " \t\"'\\"):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_systemd(spec: ServiceSpec) -> str:
    system = spec.kind == "systemd-system"
    lines = [
        "# Written by `skulk-kernel service install`; `skulk-kernel service uninstall` removes it.",
        "[Unit]",
        f"Description=Skulk node (profile {spec.profile})",
    ]
    if system:  # the user manager has no network-online.target
        lines += ["Wants=network-online.target", "After=network-online.target"]
    lines += [
        "",
        "[Service]",
        "Type=simple",
        "ExecStart=" + " ".join(_systemd_quote(a) for a in spec.argv()),
        f"Environment={_systemd_quote('SKULK_HOME=' + str(spec.home))}",
        "Environment=PYTHONUNBUFFERED=1",
        "Restart=on-failure",
        "RestartSec=5",
        "# A runner the kernel OOM-kills must not take the node down with it.",
        "OOMPolicy=continue",
        "KillSignal=SIGINT",
        "TimeoutStopSec=30",
    ]
    if system and spec.run_as:
        lines.append(f"User={spec.run_as}")
    lines += ["", "[Install]", f"WantedBy={'multi-user.target' if system else 'default.target'}", ""]
    return "\n".join(lines)


def render_launchd(spec: ServiceSpec) -> str:
    logs = spec.home / "logs"
    plist = {
        "Label": LAUNCHD_LABEL,
        "ProgramArguments": spec.argv(),
        "EnvironmentVariables": {"SKULK_HOME": str(spec.home), "PYTHONUNBUFFERED": "1"},
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},  # restart on failure, not after a clean stop
        "ThrottleInterval": 5,
        "StandardOutPath": str(logs / "node.out.log"),
        "StandardErrorPath": str(logs / "node.err.log"),
    }
    return plistlib.dumps(plist).decode()


def render(spec: ServiceSpec) -> str:
    return render_launchd(spec) if spec.kind == "launchd" else render_systemd(spec)


def _digest(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def manifest_path(home: Path) -> Path:
    return home / MANIFEST


def read_manifest(home: Path) -> Manifest | None:
    path = manifest_path(home)
    return Manifest.model_validate_json(path.read_text()) if path.is_file() else None


def enable_commands(kind: Kind, path: Path, *, on: bool) -> list[list[str]]:
    """systemctl / launchctl lines that start (on) or stop (off) the installed service."""
    if kind == "launchd":
        domain = f"gui/{os.getuid()}"
        return [["launchctl", "bootstrap", domain, str(path)]] if on else [["launchctl", "bootout", domain, str(path)]]
    ctl = ["systemctl"] if kind == "systemd-system" else ["systemctl", "--user"]
    if on:
        return [[*ctl, "daemon-reload"], [*ctl, "enable", "--now", SYSTEMD_UNIT]]
    return [[*ctl, "disable", "--now", SYSTEMD_UNIT]]


class ServiceError(Exception):
    """Something install or uninstall refuses to do; the message says why and what to do."""


def install(spec: ServiceSpec, path: Path, *, enable: bool = False, runner: Runner | None = None) -> Manifest:
    """Write the service file (refusing to overwrite one it did not write) and the manifest."""
    previous = read_manifest(spec.home)
    ours = {f.path for f in previous.files} if previous else set()
    if path.exists() and path not in ours:
        raise ServiceError(f"{path} exists and was not written by skulk-kernel; move it away first")
    text = render(spec)
    created: list[Path] = list(previous.created_dirs) if previous else []
    missing = [p for p in [path.parent, *path.parent.parents] if not p.exists()]
    for directory in reversed(missing):
        directory.mkdir()
        created.append(directory)
    path.write_text(text)
    if not spec.home.exists():  # recorded so that uninstall removes it again if it stays empty
        spec.home.mkdir(parents=True)
        created.append(spec.home)
    manifest = Manifest(
        kind=spec.kind,
        written_at=datetime.now(UTC).isoformat(timespec="seconds"),
        files=[WrittenFile(path=path, sha256=_digest(text))],
        created_dirs=list(dict.fromkeys(created)),
    )
    if enable and runner is not None:
        manifest.enabled = all(runner(argv) == 0 for argv in enable_commands(spec.kind, path, on=True))
    manifest_path(spec.home).write_text(manifest.model_dump_json(indent=1))
    return manifest


def uninstall(home: Path, *, force: bool = False, runner: Runner | None = None) -> list[str]:
    """Remove what the manifest lists: files whose content is still ours (or all with force)."""
    manifest = read_manifest(home)
    if manifest is None:
        return [f"nothing to remove: no {manifest_path(home)}"]
    said: list[str] = []
    if manifest.enabled and runner is not None:
        for written in manifest.files:
            for argv in enable_commands(manifest.kind, written.path, on=False):
                runner(argv)
    for written in manifest.files:
        if not written.path.exists():
            said.append(f"already gone: {written.path}")
            continue
        if _digest(written.path.read_bytes()) != written.sha256 and not force:
            raise ServiceError(f"{written.path} was edited since it was written; remove it by hand or pass --force")
        written.path.unlink()
        said.append(f"removed {written.path}")
    manifest_path(home).unlink()
    for directory in sorted(set(manifest.created_dirs), key=lambda p: len(p.parts), reverse=True):
        if directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()
            said.append(f"removed empty {directory}")
    return said


def status(home: Path) -> list[str]:
    manifest = read_manifest(home)
    if manifest is None:
        return [f"not installed (no {manifest_path(home)})"]
    lines = [f"installed: {manifest.kind} at {manifest.written_at}, {'enabled' if manifest.enabled else 'not enabled'}"]
    for written in manifest.files:
        if not written.path.exists():
            state = "MISSING"
        elif _digest(written.path.read_bytes()) != written.sha256:
            state = "edited since written"
        else:
            state = "as written"
        lines.append(f"  {written.path} ({state})")
    return lines
