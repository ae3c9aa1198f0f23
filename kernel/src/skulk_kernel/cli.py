"""`skulk-kernel`: run a node, list plugins, show profiles.

Listing and showing read package metadata only, so they work on any OS without heavy libraries.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from pathlib import Path

from .plugins import PluginLoadError, install_hint, installed_plugins, kernel_version
from .profiles import ProfileError, bundled_profile_names, load_profile

DEFAULT_PROFILE = os.environ.get("SKULK_PROFILE", "auto")


def _setup_logging(verbosity: int) -> None:
    level = logging.INFO - 10 * verbosity
    logging.basicConfig(
        level=max(level, logging.DEBUG), format="%(asctime)s %(levelname)-7s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING if verbosity <= 0 else logging.NOTSET)  # not per request


def cmd_plugins(args: argparse.Namespace) -> int:
    running = kernel_version()
    plugins = installed_plugins()
    if args.json:
        print(
            json.dumps([p.__dict__ | {"compatible": p.kernel_compatible(running)} for p in plugins.values()], indent=2)
        )
        return 0
    print(f"skulk-kernel {running}")
    if not plugins:
        print("no plugins installed")
    for info in sorted(plugins.values(), key=lambda p: p.name):
        ok = "" if info.kernel_compatible(running) else "  INCOMPATIBLE with this kernel"
        print(f"  {info.name:<20} {info.distribution} {info.version:<8} kernel{info.kernel_range or ' any'}{ok}")
    return 0


def cmd_profile_show(args: argparse.Namespace) -> int:
    profile = load_profile(args.name)
    plugins = installed_plugins()
    running = kernel_version()
    print(f"profile {profile.name} ({profile.source})")
    if profile.description:
        print(f"  {profile.description}")
    print("plugins:")
    missing = 0
    for name in profile.plugins:
        info = plugins.get(name)
        if info is None:
            missing += 1
            print(f"  {name:<20} MISSING: {install_hint(name)}")
        else:
            ok = "ok" if info.kernel_compatible(running) else f"needs skulk-kernel{info.kernel_range}"
            print(f"  {name:<20} {info.distribution} {info.version} ({ok})")
    print("planes:")
    for plane in ("control", "telemetry", "data"):
        print(f"  {plane:<10} {profile.planes.transport_for(plane)}")
    if profile.plugin_config:
        print("config:")
        for plugin, table in profile.plugin_config.items():
            print(f"  [{plugin}] {json.dumps(table)}")
    if profile.notes:
        print("composed for this machine (in/out, why):", *(f"  {n}" for n in profile.notes), sep="\n")
    return 1 if missing else 0


def cmd_run(args: argparse.Namespace) -> int:
    from .hooks import NodeError
    from .node import Node, NodeOptions

    if args.log_format:  # read by whichever plugin formats logs (observe), in this process and its runners
        os.environ["SKULK_LOG_FORMAT"] = args.log_format
    options = NodeOptions(
        api_port=args.api_port,
        api_host=args.api_host,
        no_api=args.no_api,
        no_worker=args.no_worker,
        force_master=args.force_master,
        bootstrap_peers=tuple(p for p in (args.bootstrap_peers or "").split(",") if p),
        offline=args.offline or NodeOptions().offline,
    )
    if args.node_name:
        options.node_name = args.node_name
    if args.home:
        options.home = Path(args.home).expanduser()
        os.environ["SKULK_HOME"] = str(options.home)  # runners find the node's data (and cluster secret)
    if args.no_default_models:
        options.extra["no_default_models"] = True
    if args.join:
        options.extra["join_token"] = args.join
        os.environ["SKULK_JOIN_TOKEN"] = args.join  # the membership runners prove (llama.cpp RPC tunnels)
    profile = load_profile(args.profile)  # after SKULK_HOME: a composer reads it (auto)
    try:
        node = Node(profile, options)
    except NodeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    asyncio.run(node.run())
    return node.exit_code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="skulk-kernel", description="Skulk inference fabric node")
    parser.add_argument("--version", action="version", version=f"skulk-kernel {kernel_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="start a node")
    run.add_argument("--profile", default=DEFAULT_PROFILE, help="bundled profile name or a .toml path")
    run.add_argument("--api-port", type=int, default=int(os.environ.get("SKULK_API_PORT", 52415)))
    run.add_argument("--api-host", default=os.environ.get("SKULK_API_HOST", "0.0.0.0"))
    run.add_argument("--no-api", action="store_true", help="do not serve HTTP on this node")
    run.add_argument("--no-worker", action="store_true", help="never run models on this node")
    run.add_argument("--force-master", action="store_true", help="prefer this node in elections")
    run.add_argument("--bootstrap-peers", default="", help="comma-separated peer addresses")
    run.add_argument("--node-name", default=None, help="friendly name (default: hostname)")
    run.add_argument("--home", default=None, help="data directory (default: $SKULK_HOME or ~/.skulk)")
    run.add_argument("--offline", action="store_true", help="never reach for the internet")
    run.add_argument("--join", default=None, help="join token of a cluster (`skulk-kernel cluster token` on a member)")
    run.add_argument(
        "--no-default-models", action="store_true", help="do not place the profile's default models at start-up"
    )
    run.add_argument("--log-format", choices=("text", "json"), default=None, help="json: one object per line")
    run.add_argument("-v", "--verbose", action="count", default=0)
    run.add_argument("-q", "--quiet", action="count", default=0)
    run.set_defaults(func=cmd_run)

    plugins = sub.add_parser("plugins", help="list installed plugins (reads metadata only)")
    plugins.add_argument("--json", action="store_true")
    plugins.set_defaults(func=cmd_plugins)

    profile = sub.add_parser("profile", help="inspect profiles")
    psub = profile.add_subparsers(dest="profile_command", required=True)
    show = psub.add_parser("show", help="print a profile's resolved composition")
    show.add_argument("name")
    show.set_defaults(func=cmd_profile_show)
    listing = psub.add_parser("list", help="list bundled profiles")
    listing.set_defaults(func=lambda _args: print("\n".join(bundled_profile_names())))

    return parser


BUILTIN_COMMANDS = {"run", "plugins", "profile"}


def _add_plugin_commands(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """Plugins' own subcommands (register_cli_commands), only when a non-builtin command is asked.

    Loading plugins imports them, so `plugins` and `profile` never do it: they must work on any
    OS without the plugins' libraries.
    """
    wanted = next((a for a in argv if not a.startswith("-")), None)
    if wanted is None or wanted in BUILTIN_COMMANDS:
        return
    from .hooks import GuardedHooks
    from .plugins import build_plugin_manager

    try:
        pm = build_plugin_manager(load_profile(DEFAULT_PROFILE, compose=False))  # every candidate's commands
    except (ProfileError, PluginLoadError) as exc:
        print(f"warning: plugin commands unavailable: {exc}", file=sys.stderr)
        return
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    GuardedHooks(pm).call("register_cli_commands", cli=sub)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    _add_plugin_commands(parser, argv)
    args = parser.parse_args(argv)
    _setup_logging(getattr(args, "verbose", 0) - getattr(args, "quiet", 0))
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # `skulk-kernel plugins | head`
        return 0
    except (ProfileError, PluginLoadError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
