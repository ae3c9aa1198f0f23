"""Pure pieces: frames, keys, hellos, endpoints, config and the network version."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from skulk_transport_zenoh import frames
from skulk_transport_zenoh.config import NETWORK_VERSION, ZenohConfig, effective_network_version
from skulk_transport_zenoh.frames import Keys, MalformedFrame
from skulk_transport_zenoh.hello import decode_hello, encode_hello, tcp_address
from skulk_transport_zenoh.transport import ZenohTransport, normalize_endpoint, version_password


def test_frames_round_trip() -> None:
    sender = frames.sender_header("node-1")
    for payload in (b"", b"x", bytes(range(256)) * 300):
        assert frames.decode(frames.encode(sender, payload)) == ("node-1", payload)


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"SKZ",
        b"XXXX\x01a",
        frames.MAGIC,
        frames.MAGIC + b"\x00rest",
        frames.MAGIC + b"\x09short",
        frames.MAGIC + b"\x01\xff",
    ],
)
def test_malformed_frames_raise(frame: bytes) -> None:
    with pytest.raises(MalformedFrame):
        frames.decode(frame)


def test_keys() -> None:
    keys = Keys("7")
    assert keys.broadcast("control", "commands") == "skulk/7/control/commands"
    assert keys.addressed("data", "chunks", "n1") == "skulk/7/data/chunks/n1"
    assert keys.rpc("state_sync", "n1") == "skulk/7/rpc/state_sync/n1"
    assert Keys.parse_alive(keys.alive("n1")) == ("7", "n1")
    assert Keys.parse_alive("skulk/7/control/commands") is None


@pytest.mark.parametrize("bad", ["a/b", "a*", "", "x y", "q?", "$x", "#"])
def test_node_ids_must_be_one_key_chunk(bad: str) -> None:
    with pytest.raises(ValueError):
        frames.check_chunk(bad, "node id")


def test_hello_round_trip_and_garbage() -> None:
    data = encode_hello("3", "node-1", True, ["tcp/127.0.0.1:7447"])
    assert decode_hello(data) == ("3", "node-1", True, ["tcp/127.0.0.1:7447"])
    assert decode_hello(b"junk") is None
    assert decode_hello(b"SKULK-HELLO1 {not json") is None
    assert decode_hello(b"SKULK-HELLO1 " + b'{"v": 1, "node": "n"}') is None
    assert decode_hello(b"SKULK-HELLO1 " + b"x" * 600) is None


def test_tcp_address() -> None:
    assert tcp_address("tcp/127.0.0.1:7447") == ("127.0.0.1", 7447)
    assert tcp_address("tcp/0.0.0.0:7447") == ("127.0.0.1", 7447)
    assert tcp_address("tcp/host.lan:1#iface=eth0") == ("host.lan", 1)
    assert tcp_address("tcp/[::1]:7447") is None
    assert tcp_address("quic/1.2.3.4") is None


def test_bootstrap_peers_are_normalized() -> None:
    assert normalize_endpoint("127.0.0.1:7447") == "tcp/127.0.0.1:7447"
    assert normalize_endpoint(" tcp/10.0.0.2:7447 ") == "tcp/10.0.0.2:7447"
    assert normalize_endpoint("udp/10.0.0.2:7447") == "udp/10.0.0.2:7447"


def test_network_version_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SKULK_NETWORK_VERSION", raising=False)
    assert effective_network_version(ZenohConfig()) == NETWORK_VERSION
    monkeypatch.setenv("SKULK_NETWORK_VERSION", "from-env")
    assert effective_network_version(ZenohConfig()) == "from-env"
    assert ZenohTransport().network_version == "from-env"
    assert effective_network_version(ZenohConfig(network_version="cfg")) == "cfg"
    monkeypatch.setenv("SKULK_NETWORK_VERSION", "bad/version")
    with pytest.raises(ValueError):
        effective_network_version(ZenohConfig())


def test_config_validation() -> None:
    assert ZenohConfig().lease_s == 3.0 and ZenohConfig().multicast_scouting and ZenohConfig().gossip_scouting
    with pytest.raises(ValidationError):
        ZenohConfig(network_version="a/b")
    with pytest.raises(ValidationError):
        ZenohConfig(unknown_field=1)  # type: ignore[call-arg]


def test_passwords_differ_per_version() -> None:
    assert version_password("1") != version_password("2")
    assert version_password("1") == version_password("1")


def test_hello_asks_a_new_address_at_once_and_stops_at_once() -> None:
    """The hello thread sleeps until its next probe (no polling), so an address added later must
    wake it: past the first quick probes (one a second, five of them) the next one is a minute
    away here, yet the new address is asked, and its version mismatch seen, at once."""
    import socket
    import threading
    import time

    from skulk_transport_zenoh.hello import HelloService

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mismatches: list[tuple[str, str]] = []
    seen = threading.Event()
    answering = HelloService("node-a", "v1", 60.0, lambda n, v, w: None, set)
    asking = HelloService("node-b", "v2", 60.0, lambda n, v, w: (mismatches.append((n, v)), seen.set()), set)
    answering.bind([port])
    asking.bind([])
    answering.start()
    asking.start()
    try:
        time.sleep(4.6)  # the five quick probes (0.2 s, then every second) are done: the next is 60 s away
        added = time.monotonic()
        asking.add_static([("127.0.0.1", port)])
        assert seen.wait(5), "the new address was not asked"
        assert time.monotonic() - added < 1.0 and mismatches[0] == ("node-a", "v1")
    finally:
        stopping = time.monotonic()
        asking.stop()
        answering.stop()
        assert time.monotonic() - stopping < 1.0  # a sleeping thread still stops at once


def test_a_send_lane_loses_no_wake_while_its_thread_sleeps_untimed() -> None:
    """The lane's thread sleeps without a timeout between bursts (no wake-ups on an idle node), so
    every message a producer offers while it goes idle must wake it: 3,000 messages in bursts with
    pauses between, each delivered in order within the bound (a lost wake would stall to the end)."""
    import random
    import threading
    import time
    from types import SimpleNamespace

    from skulk_kernel.api import Plane
    from skulk_transport_zenoh.transport import _Lane

    delivered: list[bytes] = []
    done = threading.Event()

    class _Publisher:
        def put(self, frame: bytes) -> None:
            delivered.append(frame)
            if len(delivered) == 3000:
                done.set()

        def undeclare(self) -> None:
            pass

    session = SimpleNamespace(declare_publisher=lambda key, **_: _Publisher())
    lane = _Lane(SimpleNamespace(_session=session), Plane.TELEMETRY, maxsize=10_000)  # type: ignore[arg-type]
    lane.thread.start()
    try:
        for i in range(3000):
            assert lane.offer(("k", str(i).encode()))
            if random.random() < 0.05:
                time.sleep(random.choice((0, 0.0001, 0.001)))  # let the thread drain and go idle
        assert done.wait(5.0), f"a wake was lost: {len(delivered)} of 3000 delivered"
        assert delivered == [str(i).encode() for i in range(3000)]
        started = time.monotonic()
        lane.stop()
        lane.thread.join(2.0)
        assert not lane.thread.is_alive() and time.monotonic() - started < 1.0
    finally:
        lane.stop()
