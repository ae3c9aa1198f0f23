"""The Batch API on one real node (the echo engine): the openai SDK's calls as written, the four
endpoints, a bad line, the bounds (413, 400), cancel, list and delete."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from skulk_testing.echo_node import ALL_PLUGINS, ECHO, EMBED, echo_node
from skulk_testing.nodes import NodeProcess

pytestmark = pytest.mark.slow
EXTRA = "\n[plugins.batch]\nmax_file_bytes = 200000\nsegment_lines = 4\nsegment_s = 0.3\n"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    with echo_node(tmp_path_factory.mktemp("batch"), (ECHO, EMBED), [*ALL_PLUGINS, "batch"], EXTRA) as proc:
        yield proc


@pytest.fixture
def client(node: NodeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0)


def wait_done(client: openai.OpenAI, batch_id: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "cancelled", "expired"):
            return batch
        time.sleep(0.2)
    raise TimeoutError(f"batch {batch_id} still {batch.status}")


def jsonl(items: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(item) + "\n" for item in items).encode()


def test_every_endpoint_and_a_bad_line_through_the_openai_sdk(client: openai.OpenAI) -> None:
    lines = [
        {
            "custom_id": f"chat-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": ECHO, "messages": [{"role": "user", "content": f"hello {i}"}], "max_tokens": 8},
        }
        for i in range(6)
    ] + [
        {"custom_id": "emb", "method": "POST", "url": "/v1/embeddings", "body": {"model": EMBED, "input": "a text"}},
        {"custom_id": "resp", "method": "POST", "url": "/v1/responses", "body": {"model": ECHO, "input": "hi there"}},
        {
            "custom_id": "text",
            "url": "/v1/completions",
            "body": {"model": ECHO, "prompt": "once upon", "max_tokens": 4},
        },
        {"custom_id": "nourl", "method": "POST", "url": "/v1/nowhere", "body": {"model": ECHO}},
        {"custom_id": "badbody", "method": "POST", "url": "/v1/chat/completions", "body": {"model": ECHO}},
    ]
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes == len(jsonl(lines))
    assert client.files.retrieve(uploaded.id).filename == "in.jsonl"
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"k": "v"}
    )
    assert batch.status in ("validating", "in_progress") and batch.metadata == {"k": "v"}
    done = wait_done(client, batch.id)
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (11, 9, 2)
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    out = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    assert [o["custom_id"] for o in out] == [*(f"chat-{i}" for i in range(6)), "emb", "resp", "text"]
    assert all(o["response"]["status_code"] == 200 and o["error"] is None for o in out)
    assert "hello 3" in out[3]["response"]["body"]["choices"][0]["message"]["content"]
    assert out[6]["response"]["body"]["data"][0]["embedding"]
    assert out[7]["response"]["body"]["object"] == "response"
    assert out[8]["response"]["body"]["object"] == "text_completion"
    assert done.error_file_id is not None
    errs = {e["custom_id"]: e for e in map(json.loads, client.files.content(done.error_file_id).text.splitlines())}
    assert errs["nourl"]["error"]["code"] == "invalid_url" and errs["nourl"]["response"] is None
    assert errs["badbody"]["response"]["status_code"] == 400  # the route's own 4xx for its body
    assert batch.id in [b.id for b in client.batches.list()]
    listed = {f.id: f.purpose for f in client.files.list()}
    assert listed[done.output_file_id] == "batch_output" and listed[uploaded.id] == "batch"
    assert client.files.delete(done.error_file_id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(done.error_file_id)


def test_bounds_and_bad_requests_are_4xx_that_say_what_to_fix(client: openai.OpenAI, node: NodeProcess) -> None:
    with pytest.raises(openai.APIStatusError) as big:
        client.files.create(file=("big.jsonl", io.BytesIO(b"x" * 300_000)), purpose="batch")
    assert big.value.status_code == 413 and "200000" in big.value.message
    with pytest.raises(openai.BadRequestError) as purpose:
        client.files.create(file=("a.jsonl", io.BytesIO(b"{}\n")), purpose="fine-tune")
    assert "purpose=batch" in purpose.value.message
    good = client.files.create(file=("a.jsonl", io.BytesIO(b"{}\n")), purpose="batch")
    with pytest.raises(openai.BadRequestError) as endpoint:
        client.batches.create(input_file_id=good.id, endpoint="/v1/moderations", completion_window="24h")  # type: ignore[arg-type]
    assert "endpoint must be one of" in endpoint.value.message
    with pytest.raises(openai.BadRequestError):
        client.batches.create(input_file_id=good.id, endpoint="/v1/embeddings", completion_window="1h")  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError) as missing:
        client.batches.create(input_file_id="file-nope", endpoint="/v1/embeddings", completion_window="24h")
    assert "upload one" in missing.value.message
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_" + "0" * 24)
    assert httpx.post(node.url + "/v1/files", json={"a": 1}).status_code == 400

    def chunked() -> Iterator[bytes]:  # no Content-Length: refused once the count passes the bound
        yield b'--b\r\nContent-Disposition: form-data; name="file"; filename="x.jsonl"\r\n\r\n'
        yield from (b"x" * 10000 for _ in range(40))
        yield b"\r\n--b--\r\n"

    got = httpx.post(
        node.url + "/v1/files", content=chunked(), headers={"content-type": "multipart/form-data; boundary=b"}
    )
    assert got.status_code == 413 and got.json()["error"]["code"] == "file_too_large"
    assert httpx.get(node.url + "/v1/batch-peer/files/..%2F..%2Fetc").status_code == 400
    assert httpx.post(node.url + "/v1/batches", content=b"nope").status_code == 400
    # a file with a custom_id used twice fails the batch, with the reason in errors
    dup = jsonl([{"custom_id": "x", "url": "/v1/embeddings", "body": {"model": EMBED, "input": "a"}}] * 2)
    failed = wait_done(
        client,
        client.batches.create(
            input_file_id=client.files.create(file=("d.jsonl", io.BytesIO(dup)), purpose="batch").id,
            endpoint="/v1/embeddings",
            completion_window="24h",
        ).id,
    )
    assert failed.status == "failed" and failed.errors is not None and failed.errors.data
    assert failed.errors.data[0].code == "duplicate_custom_id" and failed.failed_at


def test_cancel_stops_a_batch_and_keeps_what_was_answered(client: openai.OpenAI) -> None:
    slow = "/slow " + " ".join(f"w{i}" for i in range(10))  # 0.5 s each
    lines = [
        {
            "custom_id": f"s{i}",
            "url": "/v1/chat/completions",
            "body": {"model": ECHO, "messages": [{"role": "user", "content": slow}]},
        }
        for i in range(40)
    ]
    uploaded = client.files.create(file=("s.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    time.sleep(1.5)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = wait_done(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at
    assert done.request_counts is not None and 0 < done.request_counts.completed < 40
    if done.output_file_id:
        out = client.files.content(done.output_file_id).text.splitlines()
        assert len(out) == done.request_counts.completed
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)


def test_files_and_batches_belong_to_the_key_that_made_them(node: NodeProcess) -> None:
    """Another inference key sees none of them (404, not 403: ids cannot be probed); an operator key
    and a caller without a key (loopback) see all."""

    def key(name: str, scope: str = "inference") -> str:
        r = node.post("/v1/keys", json={"name": name, "scope": scope})
        assert r.status_code == 200, r.text
        return str(r.json()["key"])

    def sdk(api_key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=node.url + "/v1", api_key=api_key, max_retries=0)

    alice, bob, ops = sdk(key("alice")), sdk(key("bob")), sdk(key("ops", "operator"))
    line = {"model": ECHO, "messages": [{"role": "user", "content": "mine"}], "max_tokens": 4}
    data = jsonl([{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": line}])
    uploaded = alice.files.create(file=("mine.jsonl", io.BytesIO(data)), purpose="batch")
    batch = alice.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    done = wait_done(alice, batch.id)
    assert done.status == "completed" and done.output_file_id
    assert json.loads(alice.files.content(done.output_file_id).text)["custom_id"] == "a"

    assert uploaded.id not in {f.id for f in bob.files.list()}
    assert batch.id not in {b.id for b in bob.batches.list()}
    for call in (
        lambda: bob.files.retrieve(uploaded.id),
        lambda: bob.files.content(done.output_file_id),
        lambda: bob.batches.retrieve(batch.id),
        lambda: bob.batches.cancel(batch.id),
        lambda: bob.files.delete(uploaded.id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    with pytest.raises(openai.BadRequestError, match="no file"):  # nor start a batch on alice's file
        bob.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")

    for viewer in (ops, openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0)):
        assert uploaded.id in {f.id for f in viewer.files.list()}
        assert viewer.batches.retrieve(batch.id).id == batch.id
    assert alice.files.delete(uploaded.id).deleted
