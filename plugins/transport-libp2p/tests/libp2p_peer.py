"""A libp2p transport peer in its own process, for the process-level fault tests.

    python libp2p_peer.py --node NODE --version V [--bootstrap MULTIADDR ...] [--burst N]

Prints one JSON object per line: {"ready": [listen multiaddrs], "peer_id": ...}, {"peer": id,
"joined": bool}. COMMANDS are echoed back on LOCAL_EVENTS; --burst N publishes N messages
b"burst-<i>" on GLOBAL_EVENTS once it has a peer. Stops cleanly when stdin closes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import threading

from skulk_kernel.api import Topic
from skulk_transport_libp2p.config import Libp2pConfig
from skulk_transport_libp2p.transport import Libp2pTransport


def emit(obj: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--node", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--bootstrap", action="append", default=[])
    parser.add_argument("--burst", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format=f"[peer {args.node}] %(name)s %(levelname)s %(message)s"
    )
    transport = Libp2pTransport(
        Libp2pConfig(
            listen=["/ip4/127.0.0.1/tcp/0"], bootstrap=args.bootstrap, network_version=args.version, mdns=False
        )
    )
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), loop.call_soon_threadsafe(stop.set)), daemon=True).start()
    echoes: asyncio.Queue[bytes] = asyncio.Queue()
    transport.subscribe(
        Topic.COMMANDS,
        lambda sender, payload: sender != args.node and loop.call_soon_threadsafe(echoes.put_nowait, payload),
    )
    transport.on_peer(lambda e: emit({"peer": e.node_id, "joined": e.joined}))
    await transport.start(args.node, {"plane": "control"})
    emit({"ready": transport.listen, "peer_id": transport.peer_id})

    async def echo() -> None:
        while True:
            await transport.publish(Topic.LOCAL_EVENTS, await echoes.get())

    async def burst() -> None:
        while not transport.peers:
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.5)  # a gossipsub heartbeat: the mesh has formed
        for i in range(args.burst):
            await transport.publish(Topic.GLOBAL_EVENTS, b"burst-%d" % i)
        emit({"burst_sent": args.burst})

    tasks = [asyncio.ensure_future(echo())]
    if args.burst:
        tasks.append(asyncio.ensure_future(burst()))
    await stop.wait()
    for task in tasks:
        task.cancel()
    await transport.stop()
    emit({"stopped": True})


if __name__ == "__main__":
    asyncio.run(main())
