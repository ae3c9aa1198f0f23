"""Test clusters that never merge: one cluster secret per test process.

Every node a test starts inherits ``$SKULK_JOIN_TOKEN``. Without one, all nodes of a user on a host
share ``~/.skulk/cluster.secret`` and form one cluster, which is what an operator wants and what a
test run must not have: pytest-xdist runs several workers side by side, each starting its own
nodes, and a node of one worker would find another worker's nodes by multicast and join them.

So each test process (the xdist controller and every worker) gets a fresh secret at start. Nodes
started by one worker form clusters as before (several nodes of one test find each other); a node
of another worker holds another secret, so its TLS handshake fails and the attempt is refused and
counted (``REFUSED PEER``, ``refused_peers``), never merged. A test that wants a cluster of its
own beside another one (or an outsider) passes ``cluster_env()`` in the node's env.

This also keeps a test run on an operator's machine out of the operator's own cluster.
"""

from __future__ import annotations

import os
import secrets

ENV_JOIN_TOKEN = "SKULK_JOIN_TOKEN"


def new_join_token() -> str | None:
    """A join token for a fresh random cluster secret; None where no transport that uses one is installed.

    The token format belongs to transport-zenoh (secret.py); it is imported here, lazily, so a plugin
    author's environment without it still loads this plugin.
    """
    try:
        from skulk_transport_zenoh.secret import SECRET_BYTES, encode_token
    except ImportError:
        return None
    return encode_token(secrets.token_bytes(SECRET_BYTES))


def cluster_env() -> dict[str, str]:
    """Env for a node that must form a cluster of its own: a fresh cluster secret."""
    token = new_join_token()
    return {ENV_JOIN_TOKEN: token} if token else {}


def isolate_this_process() -> str | None:
    """Give this test process (and every node it starts) a cluster secret of its own; returns the token."""
    token = new_join_token()
    if token:
        os.environ[ENV_JOIN_TOKEN] = token
    return token
