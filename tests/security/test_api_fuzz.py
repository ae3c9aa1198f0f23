"""Acceptance 5 of [secure]: schemathesis on a real node's own OpenAPI, every route: no server error.

One node process (echo engine, all four APIs, control routes) is fuzzed through its `/openapi.json`:
for every operation a bounded number of schema-valid cases and of cases that break the schema
(wrong types, missing fields, bad values), each sent over real HTTP. Every answer must be below 500
and must not carry a Python stack trace; a request that hangs past the client timeout fails too.
The counts are printed (`-s`) for the closing note.

Most POST routes read their JSON themselves (provider-native errors), so their OpenAPI declares no
request body and schemathesis sends none. For those the test draws bodies itself: arbitrary JSON
(and non-JSON bytes), and a known-good body per route with fields dropped or replaced by arbitrary
JSON values, so every parser sees wrong types, missing fields and odd nesting.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from skulk_testing.nodes import NodeProcess, free_port

pytestmark = pytest.mark.slow

PROFILE = """
[profile]
name = "fuzz"
plugins = ["master", "worker", "engine-echo", "store", "api-control", "api-openai", "api-anthropic",
           "api-ollama", "observe"]

[planes]
control = "local"

[plugins.master]
default_models = ["skulk/echo", "skulk/echo-embed"]
"""

EXAMPLES = int(os.environ.get("SKULK_FUZZ_EXAMPLES", "8"))  # per operation and generation mode
CALL_TIMEOUT_S = 15.0
TRACE_MARKERS = ("Traceback (most recent call last)", 'File "/')


def _fuzz_operation(operation: Any, base_url: str, mode: Any, found: list[str], counts: Counter[str]) -> None:
    from hypothesis import HealthCheck, Phase, given, settings

    label = f"{operation.method.upper()} {operation.path}"

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: report the first failure as found
        suppress_health_check=list(HealthCheck),
        derandomize=True,
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        counts[label] += 1
        try:
            response = case.call(base_url=base_url, timeout=CALL_TIMEOUT_S)
        except Exception as exc:  # a hang or a dropped connection is a failure too
            found.append(f"{label} [{mode.value}]: no answer ({type(exc).__name__}: {exc}) to {_describe(case)}")
            return
        text = response.content.decode(errors="replace")  # some routes answer bytes (archives)
        if response.status_code >= 500:
            found.append(f"{label} [{mode.value}]: {response.status_code} {text[:300]!r} to {_describe(case)}")
        elif any(marker in text for marker in TRACE_MARKERS):
            found.append(f"{label} [{mode.value}]: stack trace in a {response.status_code} to {_describe(case)}")

    from hypothesis.errors import Unsatisfiable

    try:
        run()
    except Unsatisfiable:
        pass  # nothing in this operation to break (no parameters, no body): only the positive cases


GOOD_BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": "skulk/echo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    "/bench/chat/completions": {"model": "skulk/echo", "messages": [{"role": "user", "content": "hi"}]},
    "/v1/messages": {"model": "skulk/echo", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
    "/v1/messages/count_tokens": {"model": "skulk/echo", "messages": [{"role": "user", "content": "hi"}]},
    "/v1/responses": {"model": "skulk/echo", "input": "hi", "max_output_tokens": 4},
    "/v1/embeddings": {"model": "skulk/echo-embed", "input": "hi"},
    "/api/chat": {"model": "skulk/echo", "messages": [{"role": "user", "content": "hi"}], "stream": False},
    "/api/generate": {"model": "skulk/echo", "prompt": "hi", "stream": False, "options": {"num_predict": 4}},
    "/api/embed": {"model": "skulk/echo-embed", "input": "hi"},
    "/api/embeddings": {"model": "skulk/echo-embed", "prompt": "hi"},
    "/api/show": {"model": "skulk/echo"},
    "/v1/keys": {"name": "fuzz", "scope": "inference", "tokens_per_min": 100},
    "/place_instance": {"model_id": "skulk/echo", "min_nodes": 1},
    "/models/add": {"path": "/nonexistent/model.gguf"},
    "/v1/tracing": {"enabled": True},
}


def _json_values() -> Any:
    from hypothesis import strategies as st

    scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12)
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
        max_leaves=8,
    )


def _bodies(good: dict[str, Any]) -> Any:
    """Raw request bodies: the good one with fields dropped or replaced, arbitrary JSON, non-JSON."""
    from hypothesis import strategies as st

    missing = object()
    field = {k: st.sampled_from([v, missing]) | _json_values() for k, v in good.items()}
    mutated = st.fixed_dictionaries(field).map(lambda d: {k: v for k, v in d.items() if v is not missing})
    as_json = (mutated | _json_values()).map(lambda v: json.dumps(v).encode())
    return as_json | st.binary(max_size=64)


def _fuzz_bodies(base_url: str, method: str, path: str, found: list[str], counts: Counter[str]) -> None:
    import httpx
    from hypothesis import HealthCheck, Phase, given, settings

    label = f"{method.upper()} {path} [bodies]"
    good = GOOD_BODIES.get(path, {})

    @settings(
        max_examples=EXAMPLES * 2,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
        derandomize=True,
    )
    @given(body=_bodies(good))
    def run(body: bytes) -> None:
        counts[label] += 1
        try:
            response = httpx.request(
                method,
                base_url + path,
                content=body,
                headers={"content-type": "application/json"},
                timeout=CALL_TIMEOUT_S,
            )
        except httpx.HTTPError as exc:
            found.append(f"{label}: no answer ({type(exc).__name__}: {exc}) to {body[:200]!r}")
            return
        text = response.content.decode(errors="replace")
        if response.status_code >= 500 or any(marker in text for marker in TRACE_MARKERS):
            found.append(f"{label}: {response.status_code} {text[:300]!r} to {body[:200]!r}")

    run()


def _describe(case: Any) -> str:
    body = case.body if not type(case.body).__name__ == "NotSet" else None
    return f"path={case.path_parameters} query={case.query} body={str(body)[:200]}"


def test_no_route_answers_a_server_error_or_a_stack_trace(tmp_path: Path) -> None:
    import schemathesis
    from schemathesis import GenerationMode

    profile = tmp_path / "fuzz.toml"
    profile.write_text(PROFILE)
    node = NodeProcess(profile=str(profile), home=tmp_path / "node", api_port=free_port(), env={"HOME": str(tmp_path)})
    try:
        node.start().wait_api(90).wait_ready("skulk/echo", 90)
        schema = schemathesis.openapi.from_url(f"{node.url}/openapi.json", timeout=10)
        operations = [result.ok() for result in schema.get_all_operations()]
        found: list[str] = []
        counts: Counter[str] = Counter()
        for operation in operations:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                _fuzz_operation(operation, node.url, mode, found, counts)
        bodyless = [
            (o.method, o.path)
            for o in operations
            if o.method.upper() in ("POST", "PUT") and not o.body and "{" not in o.path
        ]
        for method, path in bodyless:
            _fuzz_bodies(node.url, method, path, found, counts)
        assert node.proc is not None and node.proc.poll() is None, "the node died under the fuzzer"
        assert node.get("/node_id").status_code == 200
        print(
            f"\nschemathesis: {len(operations)} operations, {sum(counts.values())} cases "
            f"({len(bodyless)} routes also with drawn bodies), {len(found)} failures"
        )
        for label, n in sorted(counts.items()):
            print(f"  {n:4d}  {label}")
        assert not found, "server errors or stack traces:\n" + "\n".join(found[:40])
        assert len(operations) >= 20 and all(counts[f"{o.method.upper()} {o.path}"] for o in operations)
    finally:
        node.stop()
