"""Units of the providers plugin: descriptors, version checks, and the call lifecycle between a
Caller and a CallServer joined by an in-memory link (the real code on both sides, no transport)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import ValidationError
from skulk_providers.api import Capability, Descriptor, IoMode, ProviderError
from skulk_providers.client import Caller, CallHandle
from skulk_providers.config import ProvidersConfig
from skulk_providers.extensions import check_version
from skulk_providers.frames import CallError, End, Open, Output, Reorder, Started, decode, encode
from skulk_providers.server import CallServer
from skulk_testing.conformance import PluginConformance


class TestProvidersPlugin(PluginConformance):
    plugin_name = "providers"
    hook_owners = ("api-control",)  # it implements register_api_routes


OBJ = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


def _descriptor(mode: IoMode, cid: str = "t.cap") -> Descriptor:
    return Descriptor(id=cid, version="1.0.0", description="test", input_schema=OBJ, output_schema=OBJ, mode=mode)


class Unary(Capability):
    descriptor = _descriptor(IoMode.UNARY, "t.unary")

    async def call(self, payload: Any) -> Any:
        if payload["text"] == "raise":
            raise RuntimeError("boom")
        if payload["text"] == "typed":
            raise ProviderError("no such voice", "invalid_input")
        if payload["text"] == "bad-output":
            return {"nope": 1}
        if payload["text"] == "slow":
            await asyncio.sleep(30)
        return {"text": payload["text"][::-1]}


class Duplex(Capability):
    descriptor = _descriptor(IoMode.BIDIRECTIONAL, "t.duplex")

    async def stream(self, inputs: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for message in inputs:
            yield {"text": message["text"].upper()}
        yield {"text": "done"}


class Collect(Capability):
    descriptor = _descriptor(IoMode.CLIENT_STREAMING, "t.collect")

    async def stream(self, inputs: AsyncIterator[Any]) -> AsyncIterator[Any]:
        texts = [m["text"] async for m in inputs]
        yield {"text": " ".join(texts)}
        if texts == ["twice"]:
            yield {"text": "again"}


def test_descriptor_revision_follows_the_contract() -> None:
    a, b = _descriptor(IoMode.UNARY), _descriptor(IoMode.BIDIRECTIONAL)
    assert a.ref == "t.cap@1.0.0" and len(a.revision) == 16
    assert a.revision == _descriptor(IoMode.UNARY).revision != b.revision
    with pytest.raises(ValidationError, match="semantic version"):
        Descriptor(id="x", version="1.0", description="d", input_schema=OBJ, output_schema=OBJ, mode=IoMode.UNARY)
    with pytest.raises(ValidationError):
        Descriptor(id="x", version="1.0.0", description="d", input_schema={"type": 5}, output_schema=OBJ,
                   mode=IoMode.UNARY)  # fmt: skip


def test_version_check_names_both_versions() -> None:
    assert check_version(">=0.1,<0.2", "0.1.0") is None
    why = check_version(">=9,<10", "0.1.0")
    assert why and "skulk-kernel>=9,<10" in why and "0.1.0" in why
    assert "declares no skulk_requires" in (check_version(None, "0.1.0") or "")
    assert "not a version specifier" in (check_version("banana", "0.1.0") or "")


def test_reorder_delivers_in_sequence() -> None:
    r = Reorder(first=0)
    assert r.push(Output(call_id="c", seq=2, data=1)) == []
    got = r.push(Started(call_id="c", revision="r")) + r.push(Output(call_id="c", seq=1, data=0))
    assert [f.seq for f in got] == [0, 1, 2]
    assert r.push(Output(call_id="c", seq=1, data=0)) == []  # a duplicate


class Link:
    """Caller on node "a", server on node "b", frames through encode/decode like the real topic."""

    def __init__(self, config: ProvidersConfig | None = None, reachable: set[str] | None = None) -> None:
        self.config = config or ProvidersConfig(max_concurrent_calls=2)
        self.alive = reachable or {"a", "b"}
        caps: dict[str, Capability] = {c.descriptor.ref: c for c in (Unary(), Duplex(), Collect())}
        self.server = CallServer(caps, self.config, self._to_a, self._spawn, lambda: self.alive)
        self.caller = Caller("a", self._to_b, self.config.max_payload_bytes)
        self.tasks: set[asyncio.Task[Any]] = set()

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        return task

    async def _to_b(self, node: str, payload: bytes) -> None:
        assert node == "b"
        await self.server.on_frame("a", decode(payload), len(payload))

    async def _to_a(self, node: str, payload: bytes) -> None:
        self.caller.on_frame("b", decode(payload))

    async def open(self, cap: Capability, data: Any = None, deadline: float = 5.0, revision: str | None = None) -> Any:
        d = cap.descriptor
        return await self.caller.open("b", d.ref, revision or d.revision, d.mode, deadline, data=data,
                                      has_input=not d.mode.streams_input)  # fmt: skip


async def test_unary_call_and_its_typed_errors() -> None:
    link = Link()
    assert await (await link.open(Unary(), {"text": "abc"})).result() == {"text": "cba"}
    cases = [
        ({"text": 5}, "invalid_input", 400),
        ({"text": "raise"}, "provider_error", 502),
        ({"text": "typed"}, "invalid_input", 400),
        ({"text": "bad-output"}, "invalid_output", 502),
    ]
    for data, code, status in cases:
        with pytest.raises(CallError) as err:
            await (await link.open(Unary(), data)).result()
        assert (err.value.code, err.value.status) == (code, status), err.value.message
    with pytest.raises(CallError) as err:
        await (await link.open(Unary(), {"text": "x"}, revision="0" * 16)).result()
    assert err.value.code == "revision_mismatch" and err.value.status == 409
    with pytest.raises(CallError) as err:
        await (await link.open(Unary(), {"text": "slow"}, deadline=0.2)).result()
    assert err.value.code == "deadline_exceeded"
    assert await (await link.open(Unary(), {"text": "still serving"})).result() == {"text": "gnivres llits"}
    assert link.server.active == 0


async def test_busy_node_answers_429_and_cancel_frees_the_slot() -> None:
    link = Link()
    slow = [await link.open(Unary(), {"text": "slow"}) for _ in range(2)]
    with pytest.raises(CallError) as err:
        await (await link.open(Unary(), {"text": "x"})).result()
    assert (err.value.code, err.value.status) == ("busy", 429)
    for handle in slow:
        await handle.cancel()
    for _ in range(50):
        if link.server.active == 0:
            break
        await asyncio.sleep(0.02)
    assert link.server.active == 0  # the provider-side tasks were cancelled, not left running
    assert await (await link.open(Unary(), {"text": "ok"})).result() == {"text": "ko"}


async def test_bidirectional_lifecycle_half_close_ends_only_the_input() -> None:
    link = Link()
    handle = await link.open(Duplex())
    seen: list[Any] = []

    async def read() -> None:
        async for frame in handle.frames():
            seen.append(frame)

    reader = asyncio.ensure_future(read())
    for word in ("one", "two"):
        await handle.send_input({"text": word})
    await asyncio.sleep(0.05)
    assert [f.data for f in seen if isinstance(f, Output)] == [{"text": "ONE"}, {"text": "TWO"}]
    await handle.half_close()
    with pytest.raises(CallError):
        await handle.send_input({"text": "late"})
    await asyncio.wait_for(reader, 5)
    kinds = [type(f).__name__ for f in seen]
    assert kinds == ["Started", "Output", "Output", "Output", "End"] and seen[-1].ok
    assert [f.seq for f in seen] == [0, 1, 2, 3, 4]  # ordered, exactly one terminal
    assert seen[3].data == {"text": "done"}  # produced after the half-close


async def test_stream_input_schema_violation_and_client_streaming_count() -> None:
    link = Link()
    handle = await link.open(Duplex())
    await handle.send_input({"wrong": 1})
    frames = [f async for f in handle.frames()]
    assert isinstance(frames[-1], End) and frames[-1].code == "invalid_input" and "input 1" in frames[-1].message
    handle = await link.open(Collect())
    for word in ("a", "b"):
        await handle.send_input({"text": word})
    await handle.half_close()
    assert await handle.result() == {"text": "a b"}
    handle = await link.open(Collect())
    await handle.send_input({"text": "twice"})
    await handle.half_close()
    with pytest.raises(CallError, match="second output"):
        await handle.result()


async def test_wrong_mode_and_departed_caller() -> None:
    link = Link()
    d = Duplex.descriptor
    handle = await link.caller.open("b", d.ref, d.revision, IoMode.UNARY, 5, data={"text": "x"}, has_input=True)
    with pytest.raises(CallError) as err:
        await handle.result()
    assert err.value.code == "wrong_mode" and "WebSocket" in err.value.message
    handle = await link.open(Duplex())
    await asyncio.sleep(0.05)
    assert link.server.active == 1
    link.alive = {"b"}  # the caller's node left
    sweeper = asyncio.ensure_future(link.server.sweep(lambda: False))
    try:
        for _ in range(40):
            if link.server.active == 0:
                break
            await asyncio.sleep(0.1)
        assert link.server.active == 0
    finally:
        sweeper.cancel()


async def test_payload_caps_both_sides() -> None:
    link = Link(ProvidersConfig(max_payload_bytes=1024))
    with pytest.raises(CallError) as err:
        await link.open(Unary(), {"text": "x" * 5000})  # refused before it leaves the caller
    assert (err.value.code, err.value.status) == ("payload_too_large", 413)
    big = Open(call_id="c1", capability=Unary.descriptor.ref, revision=Unary.descriptor.revision,
               mode=IoMode.UNARY, deadline_s=5, input={"text": "x" * 1500}, has_input=True)  # fmt: skip
    handle = CallHandle(link.caller, "b", "c1", IoMode.UNARY, 5)
    link.caller._open["c1"] = handle
    await link.server.on_frame("a", big, len(encode(big)))  # a caller with a larger cap: the server refuses
    with pytest.raises(CallError) as err:
        await handle.result()
    assert err.value.code == "payload_too_large"


async def test_the_stream_socket_is_gated_like_the_http_routes() -> None:
    """api-control's gate checks a WebSocket's handshake as it checks a GET: an operator key for the
    capability stream from another host, none from loopback or on an open node; a refusal closes the
    socket before the handshake completes (the client sees a 403) and the route never runs."""
    from types import SimpleNamespace

    from skulk_api_control.auth import PLUGIN_DATA, ApiControlConfig, AuthGate, hash_key
    from skulk_kernel.api import State

    keys = {
        "k1": {"id": "k1", "name": "op", "scope": "operator", "sha256": hash_key("sk-op")},
        "k2": {"id": "k2", "name": "inf", "scope": "inference", "sha256": hash_key("sk-inf")},
    }
    node: Any = SimpleNamespace(state=State(plugin_data={PLUGIN_DATA: keys}))

    async def opened(host: str, key: str | None = None, config: ApiControlConfig | None = None) -> str | None:
        """None when the route ran; else the close reason the gate sent."""
        ran, sent = [], []

        async def route(scope: Any, receive: Any, send: Any) -> None:
            ran.append(scope["path"])

        async def send(message: Any) -> None:
            sent.append(message)

        async def receive() -> Any:
            return {"type": "websocket.connect"}

        headers = [(b"authorization", f"Bearer {key}".encode())] if key else []
        scope = {"type": "websocket", "path": "/v1/capabilities/stream", "headers": headers, "client": (host, 1)}
        await AuthGate(route, node, config or ApiControlConfig(), meter=None)(scope, receive, send)
        if ran:
            return None
        (close,) = sent
        assert close["type"] == "websocket.close" and close["code"] == 1008
        return str(close["reason"])

    assert await opened("127.0.0.1") is None  # loopback is exempt, as for HTTP
    assert "required" in (await opened("192.0.2.7") or "")
    assert "operator" in (await opened("192.0.2.7", "sk-inf") or "")
    assert await opened("192.0.2.7", "sk-op") is None
    assert "not valid" in (await opened("192.0.2.7", "sk-wrong") or "")
    assert await opened("192.0.2.7", config=ApiControlConfig(open=True)) is None


async def test_only_ready_capabilities_are_advertised() -> None:
    from types import SimpleNamespace

    from skulk_kernel.api import ReadingStore
    from skulk_providers.extensions import Loaded
    from skulk_providers.service import ProviderService

    class Warming(Unary):
        descriptor = _descriptor(IoMode.UNARY, "t.warming")
        is_ready = False

        def ready(self) -> bool:
            return self.is_ready

    class Broken(Unary):
        descriptor = _descriptor(IoMode.UNARY, "t.broken")

        def ready(self) -> bool:
            raise RuntimeError("its check raised")

    warming = Warming()
    caps: dict[str, Capability] = {c.descriptor.ref: c for c in (Unary(), warming, Broken())}
    node: Any = SimpleNamespace(node_id="n", facts={}, readings=ReadingStore(), reachable_nodes=lambda: {"n"},
                                spawn=lambda coro, name: asyncio.ensure_future(coro))  # fmt: skip
    service = ProviderService(node, ProvidersConfig(), Loaded(records=[], capabilities=caps))
    service.refresh()
    assert node.facts["capabilities"] == ["t.unary@1.0.0"] and service.advertised() == {"n": ("t.unary@1.0.0",)}
    warming.is_ready = True
    service.refresh()
    assert node.facts["capabilities"] == ["t.unary@1.0.0", "t.warming@1.0.0"]
    found, _ = await service.discover("n")
    assert {c["id"]: c["ready"] for c in found} == {"t.unary": True, "t.warming": True, "t.broken": False}
