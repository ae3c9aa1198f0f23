"""The JavaScript SDKs against a real node: `openai`, `@anthropic-ai/sdk`, the Vercel AI SDK (`ai` with
its openai-compatible, openai and anthropic providers: generateText, streamText, generateObject, a
required tool call) and `ollama`, as a new user would call them.

One node script (`run_sdks.mjs`) runs every check against one echo node and prints a JSON line per
check; each check is reported as its own test. The packages come from the registry with `npm ci`
against the committed lock file, once: `node_modules/` is kept (ignored by git) with a marker that
holds the lock file's hash, so a later run reinstalls only when the lock changed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from skulk_testing.echo_node import ECHO
from skulk_testing.nodes import NodeProcess

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
MARKER = HERE / "node_modules" / ".skulk-lock-sha256"
CHECKS = [
    "openai chat",
    "openai chat stream helper",
    "openai chat required tool call",
    "openai responses stream + tool round trip",
    "anthropic messages + usage keys",
    "anthropic stream stop_sequence",
    "anthropic tool_use with a direct caller",
    "anthropic thinking stream",
    *[
        f"ai {provider} {call}"
        for provider in ("openai-compatible", "openai (responses)", "openai (chat)", "anthropic")
        for call in ("generateText", "streamText", "required tool call", "generateObject")
    ],
    "ollama chat stream + thinking",
    "ollama generate context + tools + list",
]


def _installed() -> Path:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("Node.js and npm are needed for the JavaScript SDK tests")
    digest = hashlib.sha256((HERE / "package-lock.json").read_bytes()).hexdigest()
    if MARKER.is_file() and MARKER.read_text().strip() == digest:
        return Path(node)
    proc = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        pytest.skip(f"npm ci failed (no registry?): {(proc.stderr or proc.stdout)[-500:]}")
    MARKER.write_text(digest)
    return Path(node)


@pytest.fixture(scope="module")
def results(shared_echo_node: NodeProcess) -> dict[str, dict]:
    """What the JS SDKs saw of the run's shared echo node (skulk_testing): requests only."""
    node_bin = _installed()
    proc = subprocess.run(
        [str(node_bin), str(HERE / "run_sdks.mjs"), shared_echo_node.url, ECHO],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {r["name"]: r for r in lines}


@pytest.mark.parametrize("name", CHECKS)
def test_js_sdk(results: dict[str, dict], name: str) -> None:
    assert name in results, f"the script did not run {name!r} (ran: {sorted(results)})"
    assert results[name]["ok"], results[name].get("detail")


def test_every_check_of_the_script_is_listed(results: dict[str, dict]) -> None:
    assert sorted(results) == sorted(CHECKS)
