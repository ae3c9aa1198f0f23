"""Schemathesis over the OpenAPI document of an echo node: every POST and PUT route, bodies generated
from the schemas the routes declare (skulk_api_control.openapi_body), and no answer may be a 5xx.

Bounded for the suite (a few examples per route, no shrinking); the whole document with more
examples is the CLI run in the module's __main__ note below:

    .venv/bin/schemathesis run http://127.0.0.1:PORT/openapi.json -c not_a_server_error -n 20 --workers 2

The node is this module's own: generated bodies place instances, create keys and set the tracing
flag, which a shared node must not see.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from skulk_testing.echo_node import ALL_PLUGINS, ECHO, EMBED, echo_node  # noqa: E402
from skulk_testing.nodes import NodeProcess  # noqa: E402

pytestmark = pytest.mark.slow

EXAMPLES = 4  # per route: about 120 requests to a node answering in milliseconds


@pytest.fixture(scope="module")
def fuzzed_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    with echo_node(tmp_path_factory.mktemp("fuzzed"), [ECHO, EMBED], [*ALL_PLUGINS, "observe"], name="fuzzed") as node:
        yield node


@pytest.fixture(scope="module")
def api_schema(fuzzed_node: NodeProcess) -> Any:
    return schemathesis.openapi.from_url(fuzzed_node.url + "/openapi.json").include(method=["POST", "PUT"])


schema = schemathesis.pytest.from_fixture("api_schema")


def test_every_post_route_declares_its_body(fuzzed_node: NodeProcess) -> None:
    doc = fuzzed_node.get("/openapi.json").json()
    no_body = {"/v1/cancel/{command_id}", "/v1/diagnostics/node/capture"}  # they take none
    missing = [
        path
        for path, ops in doc["paths"].items()
        for method, op in ops.items()
        if method in ("post", "put") and "requestBody" not in op and path not in no_body
    ]
    assert missing == []


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_server_error(case: Any) -> None:
    case.call_and_validate(checks=[not_a_server_error], timeout=30)
