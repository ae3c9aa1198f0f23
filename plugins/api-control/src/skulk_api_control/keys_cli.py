"""`skulk-kernel keys create|list|revoke`: API keys, through the local node's control API.

From loopback no key is needed; against another node pass `--url` and an operator key
(`--api-key` or $SKULK_API_KEY).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any


def _call(args: argparse.Namespace, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    import logging

    import httpx

    logging.getLogger("httpx").setLevel(logging.WARNING)
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        response = httpx.request(method, args.url.rstrip("/") + path, json=body, headers=headers, timeout=20)
    except httpx.HTTPError as exc:
        raise SystemExit(f"error: cannot reach the node at {args.url} ({exc}); is `skulk-kernel run` up?") from None
    try:
        data = response.json()
    except ValueError:
        data = {"error": {"message": response.text}}
    if response.status_code >= 400:
        message = data.get("error", {}).get("message", data) if isinstance(data, dict) else data
        raise SystemExit(f"error: {response.status_code}: {message}")
    return data


def dashboard_link(args: argparse.Namespace, key: str) -> str:
    """The dashboard, signed in with `key`: the key rides in the URL fragment (`#key=`), which a
    browser never sends to a server, so no access log keeps it; the page moves it to the tab's
    session storage and drops it from the address bar. From loopback, the node's own LAN address
    (what a laptop would type) replaces 127.0.0.1."""
    from urllib.parse import quote, urlsplit

    base = args.url.rstrip("/")
    parts = urlsplit(base)
    if parts.hostname in ("127.0.0.1", "localhost", "::1"):
        try:
            node_id = _call(args, "GET", "/node_id")
            resources = _call(args, "GET", "/state")["nodeResources"].get(node_id, {})
            lan = [a for a in resources.get("addresses", ()) if not a.startswith("127.")]
            if lan:
                base = f"{parts.scheme}://{lan[0]}:{resources.get('apiPort') or parts.port}"
        except SystemExit:
            pass  # the loopback link still works on this host
    return f"{base}/ui/#key={quote(key, safe='')}"


def cmd_create(args: argparse.Namespace) -> int:
    body = {"name": args.name, "scope": args.scope, "tokens_per_min": args.tokens_per_min}
    data = _call(args, "POST", "/v1/keys", body)
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(data["key"])
    print(f"open the dashboard signed in: {dashboard_link(args, data['key'])}", file=sys.stderr)
    quota = f", {data['tokens_per_min']} tokens/min" if data.get("tokens_per_min") else ""
    print(
        f"(key {data['id']} '{data['name']}', scope {data['scope']}{quota}; shown once: store it now)", file=sys.stderr
    )
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    data = _call(args, "GET", "/v1/keys")
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    if not data["keys"]:
        print("no API keys (skulk-kernel keys create --name NAME)")
    for key in data["keys"]:
        quota = key["tokens_per_min"] or "-"
        print(f"{key['id']}  {key['name']:<20} {key['scope']:<9} tokens/min {quota}  used {key['tokens_last_minute']}")
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    data = _call(args, "DELETE", f"/v1/keys/{args.key}")
    print(f"revoked {data['revoked']} ({data['name']})")
    return 0


def add_keys_commands(cli: Any) -> None:
    keys = cli.add_parser("keys", help="API keys (create, list, revoke)")
    port = os.environ.get("SKULK_API_PORT", "52415")
    keys.add_argument("--url", default=f"http://127.0.0.1:{port}", help="a node's API (default: this host's)")
    keys.add_argument("--api-key", default=os.environ.get("SKULK_API_KEY"), help="an operator key (remote nodes)")
    keys.add_argument("--json", action="store_true")
    sub = keys.add_subparsers(dest="keys_command", required=True)
    create = sub.add_parser("create", help="create a key (printed once)")
    create.add_argument("--name", required=True)
    create.add_argument("--scope", choices=("inference", "operator"), default="inference")
    create.add_argument("--tokens-per-min", type=int, default=None, help="quota, cluster-wide")
    create.set_defaults(func=cmd_create)
    sub.add_parser("list", help="list keys (never the keys themselves)").set_defaults(func=cmd_list)
    revoke = sub.add_parser("revoke", help="revoke a key by id or name")
    revoke.add_argument("key")
    revoke.set_defaults(func=cmd_revoke)
