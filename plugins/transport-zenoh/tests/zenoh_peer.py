"""A Zenoh transport peer in its own process, for the process-level tests.

    python zenoh_peer.py --node NODE --version V [--connect tcp/127.0.0.1:PORT ...] [--tick]

It prints one JSON object per line on stdout:
    {"ready": [listen locators], "zid": ...}
    {"peer": node_id, "joined": bool}
    {"mismatch": node_id, "version": v}
and behaves:
    COMMANDS           echoed back on LOCAL_EVENTS (round trips)
    GLOBAL_EVENTS      counted; a payload b"COUNT?" publishes b"COUNT:<n>" on LOCAL_EVENTS
    STATE_SYNC         request/reply: answers b"snapshot-of-<node>:" + request
    --tick             publishes b"tick-<node>" on LOCAL_EVENTS every 50 ms
It stops cleanly (transport closed) on SIGTERM or when stdin closes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import threading

from skulk_kernel.api import Topic
from skulk_transport_zenoh.config import ZenohConfig
from skulk_transport_zenoh.transport import ZenohTransport


def emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--node", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--connect", action="append", default=[])
    parser.add_argument("--listen", default="tcp/127.0.0.1:0")
    parser.add_argument("--multicast-address", default="")
    parser.add_argument("--lease", type=float, default=3.0)
    parser.add_argument("--tick", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format=f"[peer {args.node}] %(name)s %(levelname)s %(message)s"
    )

    config = ZenohConfig(
        listen=[args.listen],
        connect=args.connect,
        network_version=args.version,
        lease_s=args.lease,
        multicast_scouting=bool(args.multicast_address),
        multicast_address=args.multicast_address or None,
        multicast_interface="lo" if args.multicast_address else None,
        hello_interval_s=0.5,
    )
    transport = ZenohTransport(config)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    threading.Thread(target=lambda: (sys.stdin.read(), loop.call_soon_threadsafe(stop.set)), daemon=True).start()

    count = 0
    echo_queue: asyncio.Queue[tuple[Topic, bytes]] = asyncio.Queue()

    def on_command(sender: str, payload: bytes) -> None:
        if sender != args.node:
            loop.call_soon_threadsafe(echo_queue.put_nowait, (Topic.LOCAL_EVENTS, payload))

    def on_global(sender: str, payload: bytes) -> None:
        nonlocal count
        if payload == b"COUNT?":
            loop.call_soon_threadsafe(echo_queue.put_nowait, (Topic.LOCAL_EVENTS, b"COUNT:%d" % count))
        else:
            count += 1

    transport.subscribe(Topic.COMMANDS, on_command)
    transport.subscribe(Topic.GLOBAL_EVENTS, on_global)
    transport.serve(Topic.STATE_SYNC, lambda sender, payload: f"snapshot-of-{args.node}:".encode() + payload)
    transport.on_peer(lambda e: emit({"peer": e.node_id, "joined": e.joined}))
    await transport.start(args.node, {"plane": "control"})
    emit({"ready": transport.listen_locators, "zid": transport.zid})

    async def pump() -> None:
        while True:
            topic, payload = await echo_queue.get()
            await transport.publish(topic, payload)

    async def tick() -> None:
        while True:
            await transport.publish(Topic.LOCAL_EVENTS, f"tick-{args.node}".encode())
            await asyncio.sleep(0.05)

    async def report_mismatches() -> None:
        seen: set[str] = set()
        while True:
            for node_id, peer in transport.mismatched_peers.items():
                if node_id not in seen:
                    seen.add(node_id)
                    emit({"mismatch": node_id, "version": peer.network_version})
            await asyncio.sleep(0.1)

    tasks = [asyncio.ensure_future(pump()), asyncio.ensure_future(report_mismatches())]
    if args.tick:
        tasks.append(asyncio.ensure_future(tick()))
    await stop.wait()
    for task in tasks:
        task.cancel()
    await transport.stop()
    emit({"stopped": True})


if __name__ == "__main__":
    asyncio.run(main())
