"""``skulk-kernel doctor [--json] [--fix]``: registered by this plugin through ``register_cli_commands``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def add_doctor_command(cli: Any) -> None:
    doctor = cli.add_parser("doctor", help="check this machine and say what to fix (see docs/doctor.md)")
    doctor.add_argument("--json", action="store_true", help="one JSON object per check")
    doctor.add_argument("--fix", action="store_true", help="run the fixes of checks that warn or fail")
    doctor.add_argument("--profile", default=None, help="the profile to check (default: $SKULK_PROFILE)")
    doctor.add_argument("--api-port", type=int, default=None, help="the node's API port (default: 52415)")
    doctor.add_argument("--home", default=None, help="the node's data directory (default: $SKULK_HOME)")
    doctor.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import DoctorContext, exit_code, report_text, run_checks

    overrides: dict[str, Any] = {"fix": args.fix}
    if args.profile:
        overrides["profile"] = args.profile
    if args.api_port:
        overrides["api_port"] = args.api_port
    if args.home:
        overrides["home"] = Path(args.home).expanduser()
    results = run_checks(DoctorContext(**overrides))
    if args.json:
        print(json.dumps([r.model_dump(mode="json") for r in results], indent=2))
    else:
        print(report_text(results))
    return exit_code(results)
