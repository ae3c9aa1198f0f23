"""A real, lightweight OpenAI-compatible server process for the managed-server tests.

    python xllamacpp_server.py <model.gguf> <port> [embedding]

xllamacpp runs llama.cpp's native server on its own threads inside this process; we keep the
process alive until it is signalled, exactly like a `vllm serve` would behave.
"""

from __future__ import annotations

import signal
import sys
import threading


def main() -> None:
    import xllamacpp as xlc

    p = xlc.CommonParams()
    p.model.path = sys.argv[1]
    p.hostnames = ["127.0.0.1"]
    p.port = int(sys.argv[2])
    p.n_parallel = 2
    p.cpuparams.n_threads = 1
    p.cpuparams_batch.n_threads = 1
    p.n_ctx = 2048
    p.n_threads_http = 8
    p.use_jinja = True
    p.ui = False
    p.cache_ram_mib = 0
    if len(sys.argv) > 3 and sys.argv[3] == "embedding":
        p.embedding = True
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server = xlc.Server(p)
    print("listening", server.listening_address, flush=True)
    stop.wait()
    del server


if __name__ == "__main__":
    main()
