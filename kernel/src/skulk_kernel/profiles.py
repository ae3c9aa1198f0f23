"""Profiles: which plugins a node loads, which transport carries each plane, and plugin config.

A profile is a small TOML file. Bundled profiles live beside this module; a user profile is any
path. Profiles compose capabilities; they never contain code.
"""

from __future__ import annotations

import tomllib
from importlib import metadata, resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class ProfileError(Exception):
    """A profile that cannot be found or does not validate; the message says what to fix."""


class Planes(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    control: str = "local"
    telemetry: str | None = None
    data: str | None = None

    def transport_for(self, plane: str) -> str:
        """Telemetry and data default to the control plane's transport."""
        return getattr(self, plane) or self.control


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    description: str = ""
    plugins: tuple[str, ...]
    planes: Planes = Planes()
    plugin_config: dict[str, dict[str, Any]] = Field(default_factory=dict)
    source: str = ""
    composer: str = ""  # a plugin whose compose_profile(profile) picks `plugins` for this machine (auto)
    notes: tuple[str, ...] = ()  # the composer's verdicts, one line per installed plugin (`profile show`)

    def config_for(self, plugin: str) -> dict[str, Any]:
        return dict(self.plugin_config.get(plugin, {}))


def bundled_profile_names() -> list[str]:
    folder = resources.files("skulk_kernel") / "profiles"
    return sorted(p.name.removesuffix(".toml") for p in folder.iterdir() if p.name.endswith(".toml"))


def parse_profile(text: str, source: str) -> Profile:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{source}: not valid TOML: {exc}") from None
    head = data.pop("profile", None)
    if not isinstance(head, dict):
        raise ProfileError(f"{source}: missing the [profile] table with name and plugins")
    unknown = set(data) - {"planes", "plugins"}
    if unknown:
        raise ProfileError(f"{source}: unknown tables {sorted(unknown)}; use [planes] or [plugins.NAME]")
    try:
        return Profile(
            **head, planes=Planes(**data.get("planes", {})), plugin_config=data.get("plugins", {}), source=source
        )
    except (ValidationError, TypeError) as exc:
        raise ProfileError(f"{source}: {exc}") from None


def load_profile(name_or_path: str | Path, compose: bool = True) -> Profile:
    """A bundled profile by name, or a user profile by path (anything with a slash or .toml); one
    naming a `composer` is composed for this machine unless `compose` is False (its candidates)."""
    ref = str(name_or_path)
    if "/" in ref or ref.endswith(".toml"):
        path = Path(ref).expanduser()
        if not path.is_file():
            raise ProfileError(f"profile file {path} does not exist")
        profile = parse_profile(path.read_text(), str(path))
    elif (resource := resources.files("skulk_kernel") / "profiles" / f"{ref}.toml").is_file():
        profile = parse_profile(resource.read_text(), f"bundled:{ref}")
    else:
        names = ", ".join(bundled_profile_names())
        raise ProfileError(f"no bundled profile named {ref!r}; bundled: {names}; or pass a path")
    if not (compose and profile.composer):
        return profile
    for entry_point in metadata.entry_points(group="skulk.plugins", name=profile.composer):
        return entry_point.load().compose_profile(profile)  # type: ignore[no-any-return]
    raise ProfileError(f"{profile.source}: its composer, plugin {profile.composer!r}, is not installed")
