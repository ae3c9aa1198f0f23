"""Issue [surface] acceptance 4: the `ollama` Python client's model management works as written.

A real node (cpu-llamacpp profile, llama.cpp) pulls from a loopback hub that speaks Hugging Face's
protocol (`tests/store/hub_server.py`; the store's real client is pointed at it with HF_ENDPOINT),
then `create` (from the pulled model with a system prompt, template and parameters; from an uploaded
blob; from a Modelfile naming a GGUF path on the node), `copy`, `show`, `ps` (a created model placed
and answering a chat with its own system prompt), `delete`, and `push` refused. The model is the
tiny random chat GGUF (:mod:`skulk_engine_llamacpp.tiny`), so the download and the load take
seconds.
"""

from __future__ import annotations

import hashlib
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from skulk_testing.nodes import NodeProcess, start_node

from tests.serving.placing import place_until_listed
from tests.store.hub_server import HubRepo, LoopbackHub

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ollama = pytest.importorskip("ollama")

REPO = "test-org/tiny-chat-GGUF"
FILE = "tiny-chat.Q8_0.gguf"
PULLED = f"hf.co/{REPO}:Q8_0"


@pytest.fixture(scope="module")
def gguf(models_dir: Path) -> Path:
    from skulk_engine_llamacpp.tiny import write_tiny_chatml_gguf

    return write_tiny_chatml_gguf(models_dir / "local" / "tiny-random-chatml-4k.gguf", context_length=4096)


@pytest.fixture(scope="module")
def hub(gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackHub]:
    readme = tmp_path_factory.mktemp("hub") / "README.md"
    readme.write_text("# a tiny random chat model (loopback hub)\n")
    server = LoopbackHub()
    server.add(HubRepo.from_files(REPO, {FILE: gguf, "tiny-chat.F16.gguf": gguf, "README.md": readme}))
    with server:
        yield server


@pytest.fixture(scope="module")
def node(hub: LoopbackHub, gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    pytest.importorskip("xllamacpp")
    home = tmp_path_factory.mktemp("ollama-manage")
    env = {
        "HF_ENDPOINT": hub.url,
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "SKULK_MODELS_DIR": str(home / "models"),
        "SKULK_NETWORK_VERSION": f"ollama-manage-{uuid.uuid4().hex[:8]}",
    }
    local = home / "models" / "local"
    local.mkdir(parents=True)
    shutil.copyfile(gguf, local / "tiny-chat.gguf")  # a GGUF path on the node, under its models directory
    started = start_node("cpu-llamacpp", "--no-default-models", home=home / "home", env=env)
    try:
        started.wait_api(timeout=60)
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def client(node: NodeProcess) -> Any:
    return ollama.Client(host=node.url, timeout=120)


def test_pull_streams_progress_from_the_hub_then_success(client: Any, hub: LoopbackHub) -> None:
    steps = list(client.pull(PULLED, stream=True))
    assert steps[0].status == "pulling manifest" and steps[-1].status == "success"
    progress = [s for s in steps if s.digest]
    assert progress and progress[-1].completed == progress[-1].total > 0
    assert all(s.digest.startswith("sha256:") for s in progress)
    assert hub.sent_for(FILE) > 0 and hub.sent_for("tiny-chat.F16.gguf") == 0  # the tag chose the file
    assert client.pull(PULLED).status == "success"  # stream false: one answer (already here)
    shown = client.show(PULLED)
    assert "completion" in shown.capabilities
    assert any(m.model == f"{PULLED}" or m.model == PULLED for m in client.list().models)


def test_pull_of_a_catalog_name_fetches_its_files(client: Any, node: NodeProcess, hub: LoopbackHub) -> None:
    body = {"repo_id": REPO, "file": "tiny-chat.F16.gguf", "model_id": "catalog-tiny", "download": False}
    assert node.post("/models/add", json=body, timeout=30).status_code == 200  # in the catalog, no files yet
    steps = list(client.pull("catalog-tiny:latest", stream=True))
    assert steps[-1].status == "success" and any(s.completed for s in steps if s.digest)
    assert hub.sent_for("tiny-chat.F16.gguf") > 0
    listed = {m["id"]: m for m in node.get("/models").json()["data"]}
    assert listed["catalog-tiny"]["installed"] is True


def test_pull_of_an_unknown_name_is_a_404_with_the_reason(client: Any) -> None:
    with pytest.raises(ollama.ResponseError) as err:
        client.pull("no-such-model-anywhere")
    assert err.value.status_code == 404 and "neither in the catalog" in err.value.error
    with pytest.raises(ollama.ResponseError) as err:
        client.pull("hf.co/test-org/absent-GGUF")
    assert err.value.status_code == 404


def test_create_copy_show_ps_and_delete(client: Any, node: NodeProcess, gguf: Path) -> None:
    on_node = Path(node.get("/store/storage").json().get("models_dir", "")) / "local" / "tiny-chat.gguf"
    client.pull(PULLED)
    created = client.create(
        model="terse",
        from_=PULLED,
        system="You answer in one word.",
        parameters={"temperature": 0.1, "stop": ["<|im_end|>"]},
    )
    assert created.status == "success"
    shown = client.show("terse")
    assert "temperature" in shown.parameters and "<|im_end|>" in shown.parameters
    assert f"FROM {PULLED}" in shown.modelfile and 'SYSTEM """You answer in one word."""' in shown.modelfile

    assert client.copy("terse", "terse-copy").status == "success"
    assert "You answer in one word." in client.show("terse-copy").modelfile

    digest = client.create_blob(gguf)
    assert httpx.head(f"{node.url}/api/blobs/{digest}").status_code == 200
    assert client.create(model="from-blob", files={"model.gguf": digest}).status == "success"
    assert client.show("from-blob").capabilities == ["completion"]

    modelfile = f'FROM {on_node}\nPARAMETER num_ctx 2048\nSYSTEM """Be brief."""\n'
    response = node.post("/api/create", json={"model": "from-path", "modelfile": modelfile, "stream": False})
    assert response.status_code == 200, response.text
    assert "num_ctx" in client.show("from-path").parameters

    place_until_listed(node, "terse")
    node.wait_ready("terse", timeout=120)
    assert "terse:latest" in [m.model for m in client.ps().models]
    answer = client.chat(model="terse", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 4})
    assert answer.message.role == "assistant"
    # terse's SYSTEM reaches the model: the same message reads more prompt tokens than on the bare model
    place_until_listed(node, PULLED)
    node.wait_ready(PULLED, timeout=120)
    bare = client.chat(model=PULLED, messages=[{"role": "user", "content": "hi"}], options={"num_predict": 4})
    assert answer.prompt_eval_count > bare.prompt_eval_count

    with pytest.raises(ollama.ResponseError) as err:
        client.delete("terse")  # placed: refused with the way out
    assert err.value.status_code == 409 and "delete it first" in err.value.error
    assert client.delete("terse-copy").status == "success"
    with pytest.raises(ollama.ResponseError) as err:
        client.show("terse-copy")
    assert err.value.status_code == 404
    assert client.delete("from-blob").status == "success"

    # the pulled model's file is what `terse` (created from it) reads: it stays until terse goes
    for instance in list(node.state()["instances"]):
        assert httpx.delete(f"{node.url}/instance/{instance}", timeout=30).status_code == 200
    node.wait_until(lambda: not node.state()["instances"], 60, "the instances removed")
    with pytest.raises(ollama.ResponseError) as err:
        client.delete(PULLED)
    assert err.value.status_code == 409 and "terse" in err.value.error
    assert client.delete("terse").status == "success"
    assert client.delete(PULLED).status == "success"
    with pytest.raises(ollama.ResponseError):
        client.show(PULLED)


def test_create_refuses_what_it_cannot_build(client: Any) -> None:
    for kwargs, says in (
        ({"from_": "no-such-base"}, "no model or GGUF file named"),
        ({"from_": PULLED, "quantize": "q4_K_M"}, "quantize: not supported"),
        ({"files": {"model.gguf": "sha256:" + "0" * 64}}, "is not uploaded"),
        ({}, "is required"),
    ):
        with pytest.raises(ollama.ResponseError) as err:
            client.create(model="bad", **kwargs)
        assert 400 <= err.value.status_code < 500 and says in err.value.error, (kwargs, err.value.error)


def test_push_is_refused_with_a_reason(client: Any) -> None:
    with pytest.raises(ollama.ResponseError) as err:
        client.push(PULLED)
    assert err.value.status_code == 400 and "push is not supported" in err.value.error


def test_blobs_answer_head_and_check_the_digest(node: NodeProcess) -> None:
    data = b"not really a model"
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    assert httpx.head(f"{node.url}/api/blobs/{digest}").status_code == 404
    wrong = node.post(f"/api/blobs/sha256:{'1' * 64}", content=data)
    assert wrong.status_code == 400 and "sha256" in wrong.json()["error"]
    assert node.post(f"/api/blobs/{digest}", content=data).status_code == 201
    assert httpx.head(f"{node.url}/api/blobs/{digest}").status_code == 200
    assert node.post(f"/api/blobs/{digest}", content=data).status_code == 200
    assert node.post("/api/blobs/md5:abc", content=data).status_code == 400
