"""Sends garbage to a node over a real libp2p connection of the right network version.

    python libp2p_attacker.py --version V --target /ip4/127.0.0.1/tcp/P/p2p/ID

On the gossipsub protocol: a frame that is not a protobuf (the DecodeError that used to kill the
receiving process) and 64 KB of random bytes; on the skulk link protocol: a 64 KB random frame and
a malformed hello; and 64 KB of random bytes on a raw TCP connection. Prints "done" at the end.
With --outsider it only tries to connect without the cluster secret and prints "refused" or "connected".
"""

from __future__ import annotations

import argparse
import os
import socket

import multiaddr
import trio
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.security.noise.transport import PROTOCOL_ID, Transport
from skulk_transport_libp2p.config import network_psk
from skulk_transport_zenoh.secret import resolve_secret


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


async def attack(version: str, target: str, outsider: bool) -> None:
    key = create_new_key_pair()
    # A member (it holds this user's cluster secret) whose frames are garbage; or, with --outsider,
    # a node of the right version without the secret, which must not even connect.
    secret = b"" if outsider else resolve_secret().key(f"libp2p-pnet:{version}")
    host = new_host(
        key_pair=key,
        sec_opt={PROTOCOL_ID: Transport(key, noise_privkey=create_x25519_key_pair().private_key)},
        psk=network_psk(version, secret),
    )
    info = info_from_p2p_addr(multiaddr.Multiaddr(target))
    async with host.run([multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
        if outsider:
            try:
                with trio.fail_after(10):
                    await host.connect(info)
            except Exception as exc:
                print(f"refused: {exc!r}", flush=True)
            else:
                print("connected", flush=True)
            return
        await host.connect(info)
        garbage = os.urandom(64 * 1024)
        frames = [
            (TProtocol("/meshsub/1.1.0"), varint(12) + b"\xff" * 12),  # not a protobuf: DecodeError
            (TProtocol("/meshsub/1.1.0"), varint(len(garbage)) + garbage),
            (TProtocol(f"/skulk/{version}/link/1"), len(garbage).to_bytes(4, "big") + garbage),
            (TProtocol(f"/skulk/{version}/link/1"), (9).to_bytes(4, "big") + b"H{broken}"),
            (TProtocol(f"/skulk/{version}/rpc/1"), garbage),
        ]
        for protocol, data in frames:
            try:
                with trio.fail_after(5):
                    stream = await host.new_stream(info.peer_id, [protocol])
                    await stream.write(data)
                    await trio.sleep(0.2)
                    await stream.close()
            except Exception as exc:  # the node may reset the stream: that is the point
                print(f"{protocol}: {exc!r}", flush=True)
    host_, port = (
        multiaddr.Multiaddr(target).value_for_protocol("ip4"),
        multiaddr.Multiaddr(target).value_for_protocol("tcp"),
    )
    with socket.create_connection((host_, int(port)), timeout=5) as raw:
        raw.sendall(os.urandom(64 * 1024))
    print("done", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--version", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--outsider", action="store_true", help="no cluster secret: expect to be refused")
    args = parser.parse_args()
    trio.run(attack, args.version, args.target, args.outsider)
