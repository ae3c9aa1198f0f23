"""Write docs/doctor.md from the check registry: ``python -m skulk_hardware.doctor_docs [path]``."""

from __future__ import annotations

import sys
from pathlib import Path

from .doctor import render_docs


def main(argv: list[str]) -> None:
    target = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[4] / "docs" / "doctor.md"
    target.write_text(render_docs())
    print(f"wrote {target}")


if __name__ == "__main__":
    main(sys.argv)
