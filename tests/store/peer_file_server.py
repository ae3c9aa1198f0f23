"""A holder's peer file server alone, as a process of its own (tests and bench kill it for real).

    python tests/store/peer_file_server.py DIR TOKEN [--host H] [--rate BYTES_PER_S]

Serves the files of DIR as model `m` to requests bearing TOKEN, with the store's own `FileServer`
(sendfile, ranges, keep-alive), and prints the port on its first line. `--rate` caps what each
response sends per second (sent in 256 KiB `os.sendfile` calls with pauses): a slow member, so a test
can kill it mid-file.
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from pathlib import Path

from skulk_store import peer_files
from skulk_store.peer_files import FileServer, Refused, Served


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir", type=Path)
    parser.add_argument("token")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--rate", type=float, default=0.0)
    args = parser.parse_args()
    if args.rate:
        plain = peer_files._send_range
        step = 256 << 10

        def paced(sock: socket.socket, fd: int, offset: int, count: int) -> int:
            sent = 0
            while sent < count:
                n = plain(sock, fd, offset + sent, min(step, count - sent))
                if not n:
                    break
                sent += n
                time.sleep(n / args.rate)
            return sent

        peer_files._send_range = paced

    def resolve(token: str, model_id: str, name: str) -> Served | Refused:
        if token != args.token:
            return Refused(403, "no valid transfer token for this model")
        path = args.dir / name
        if model_id != "m" or not path.is_file():
            return Refused(404, f"{name!r} is not a file of {model_id}")
        return Served(path, "requester")

    server = FileServer(resolve)
    print(server.start(args.host, args.port), flush=True)
    sys.stdin.read()  # serves until its parent closes stdin (or kills it)
    server.stop()


if __name__ == "__main__":
    main()
