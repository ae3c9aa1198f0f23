"""Free space: refuse a download or a staging copy that would not fit, and say when a disk runs low.

Every fetch (hub download, peer copy, provisioning, a staging copy that could not be a hard link)
first sums the bytes it still has to write and compares them, plus a headroom
(`[plugins.store] disk_headroom_bytes`), with the free space of the models directory's
filesystem (`shutil.disk_usage`, one `statvfs`). A shortfall raises `InsufficientDisk` before any
byte is written; the routes answer it with 507 `insufficient_disk`, and a placement's staging
fails the instance with the same message.
"""

from __future__ import annotations

import shutil
from pathlib import Path

GiB = 1 << 30
MiB = 1 << 20
#: default headroom kept free after a fetch (`disk_headroom_bytes`)
DEFAULT_HEADROOM = GiB
#: default free space under which the node reports low disk in its health (`low_disk_bytes`)
DEFAULT_LOW_DISK = 2 * GiB
CONFIG_HINT = "free space or set [plugins.store] models_dir to a larger disk"


class InsufficientDisk(RuntimeError):
    """A fetch would not fit in the free space of the models directory (plus the headroom)."""

    code = "insufficient_disk"


def human(n: int) -> str:
    """Bytes for a person: GiB from 1 GiB up, else MiB, else KiB."""
    if n >= GiB:
        return f"{n / GiB:.1f} GiB"
    if n >= MiB:
        return f"{n / MiB:.1f} MiB"
    return f"{n / 1024:.1f} KiB"


def existing(folder: Path) -> Path:
    """`folder` or its nearest existing parent (the models directory may not exist yet)."""
    folder = folder.expanduser().absolute()
    while not folder.exists() and folder.parent != folder:
        folder = folder.parent
    return folder


def free_bytes(folder: Path) -> int:
    return int(shutil.disk_usage(existing(folder)).free)


def ensure_room(folder: Path, need: int, headroom: int, what: str) -> None:
    """Raise `InsufficientDisk` when `need` bytes plus `headroom` do not fit on `folder`'s disk."""
    if need <= 0:
        return
    free = free_bytes(folder)
    if need + headroom > free:
        raise InsufficientDisk(
            f"{what} needs {human(need)} (+ {human(headroom)} headroom) on {folder}, "
            f"but only {human(free)} is free: {CONFIG_HINT}"
        )


def low_disk(folder: Path, threshold: int | None) -> str | None:
    """The health note for a models directory with less than `threshold` bytes free, else None."""
    if threshold is None:
        return None
    try:
        free = free_bytes(folder)
    except OSError as exc:
        return f"cannot read the free space of {folder}: {exc}"
    if free >= threshold:
        return None
    return (
        f"only {human(free)} free on {folder} (below [plugins.store] low_disk_bytes = {human(threshold)}): "
        f"downloads and staging copies may be refused; {CONFIG_HINT}"
    )
