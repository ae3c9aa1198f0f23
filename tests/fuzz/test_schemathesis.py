"""Schemathesis over the OpenAPI document of an echo node: every POST and PUT route, bodies generated
from the schemas the routes declare (skulk_api_control.openapi_body), and no answer may be a 5xx.

Bounded for the suite (a few examples per route, no shrinking, one seed). The whole document with more
examples is the same command without `--include-method` and with `-n 20` (issue [surface]).
Schemathesis runs as its CLI (its pytest plugin does not load under this pytest); the node is this
module's own: generated bodies place instances, create keys and set the tracing flag, which a shared
node must not see.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from skulk_testing.echo_node import ALL_PLUGINS, ECHO, EMBED, echo_node
from skulk_testing.nodes import NodeProcess

pytestmark = pytest.mark.slow

EXAMPLES = 4  # per route: a few hundred requests to a node answering in milliseconds
NO_BODY = {  # routes that take no body
    "/v1/cancel/{command_id}",
    "/v1/diagnostics/node/capture",
    "/store/purge-staging",
    "/store/models/{model_id}/download",
    "/v1/videos/{video_id}/cancel",
    "/v1/batches/{batch_id}/cancel",
}


@pytest.fixture(scope="module")
def fuzzed_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    with echo_node(
        tmp_path_factory.mktemp("fuzzed"), [ECHO, EMBED], [*ALL_PLUGINS, "observe", "batch"], name="fuzzed"
    ) as node:
        yield node


def test_every_post_route_declares_its_body(fuzzed_node: NodeProcess) -> None:
    doc = fuzzed_node.get("/openapi.json").json()
    missing = [
        path
        for path, ops in doc["paths"].items()
        for method, op in ops.items()
        if method in ("post", "put") and "requestBody" not in op and path not in NO_BODY
    ]
    assert missing == []


def test_no_server_error(fuzzed_node: NodeProcess, tmp_path: Path) -> None:
    cli = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    if cli is None:
        pytest.skip("schemathesis is not installed (pip install schemathesis)")
    command = [
        cli, "run", fuzzed_node.url + "/openapi.json",
        "--checks", "not_a_server_error",
        "--include-method", "POST", "--include-method", "PUT",
        "--phases", "examples,fuzzing",
        "--max-examples", str(EXAMPLES), "--seed", "1", "--no-shrink", "--workers", "1",
        "--suppress-health-check", "all", "--request-timeout", "30",
    ]  # fmt: skip
    proc = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert "Tested:" in out, out[-3000:]
    assert "Server error" not in out, out[-6000:]
