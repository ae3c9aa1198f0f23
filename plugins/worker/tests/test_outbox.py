"""The runner's Outbox: messages from many threads reach the worker in order per thread, in batches,
none lost; one that does not pickle is dropped alone; a closed worker end breaks nothing."""

from __future__ import annotations

import multiprocessing
import threading

from skulk_worker.runner import Outbox


def _drain(conn: multiprocessing.connection.Connection, into: list[list[tuple]] | None = None) -> list[list[tuple]]:
    """Every batch until the writer closes (end of file)."""
    batches = [] if into is None else into
    while conn.poll(5.0):
        try:
            batches.append(conn.recv())
        except EOFError:
            break
    return batches


def test_messages_from_many_threads_arrive_in_order_in_batches() -> None:
    reader, writer = multiprocessing.Pipe(duplex=False)
    box = Outbox(writer)
    got: list[list[tuple]] = []
    draining = threading.Thread(target=_drain, args=(reader, got))
    draining.start()

    def put(n: int) -> None:
        for i in range(500):
            box.put(("chunk", n, i))

    threads = [threading.Thread(target=put, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    box.close()
    draining.join()
    flat = [m for batch in got for m in batch]
    assert len(flat) == 2000
    for n in range(4):
        assert [i for (_, k, i) in flat if k == n] == list(range(500))
    assert len(got) <= 2000  # several messages travel together whenever a write was in flight


def test_a_message_that_does_not_pickle_is_dropped_alone() -> None:
    reader, writer = multiprocessing.Pipe(duplex=False)
    box = Outbox(writer)
    box.put(("status", "before"))
    box.put(("chunk", "t", threading.Lock()))  # not picklable
    box.put(("status", "after"))
    box.close()
    flat = [m for batch in _drain(reader) for m in batch]
    assert flat == [("status", "before"), ("status", "after")]


def test_a_closed_worker_end_breaks_the_box_quietly() -> None:
    reader, writer = multiprocessing.Pipe(duplex=False)
    box = Outbox(writer)
    reader.close()
    for i in range(100):
        box.put(("chunk", "t", "x" * 1000 + str(i)))
    assert box.broken
    box.close()
