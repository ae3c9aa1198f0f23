"""Unit tests of the batch plugin's pure parts: JSONL parsing and its bounds, the status machine,
the Batch object, the keeper's choice of a runner, segments."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from skulk_batch import records as rec
from skulk_batch.jsonl import InputLine, LineError, parse_input
from skulk_batch.lines import answer_line, error_line, is_ok, read_segment, segment_bytes
from skulk_batch.service import derived_file_id
from skulk_batch.storage import Storage, StorageError
from skulk_testing.conformance import PluginConformance


class TestBatchPlugin(PluginConformance):
    plugin_name = "batch"
    hook_owners = ("api-control", "hardware")  # it implements register_api_routes and plugin_fits


def line(custom_id: str, url: str = "/v1/chat/completions", **body: Any) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": {"model": "m", **body}})


def parse(text: str, max_lines: int = 100, max_line_bytes: int = 1000) -> Any:
    return parse_input(text.encode(), max_lines=max_lines, max_line_bytes=max_line_bytes)


def test_good_lines_parse_with_their_index_blank_lines_skipped() -> None:
    parsed = parse(line("a") + "\n\n" + line("b", "/v1/embeddings", input="x") + "\n")
    assert not parsed.fatal and parsed.total == 2
    assert [(x.index, x.custom_id, x.url) for x in parsed.lines] == [
        (0, "a", "/v1/chat/completions"),
        (1, "b", "/v1/embeddings"),
    ]
    assert isinstance(parsed.lines[1], InputLine) and parsed.lines[1].body["input"] == "x"


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ("not json", "invalid_json"),
        ("[1, 2]", "invalid_line"),
        (json.dumps({"url": "/v1/chat/completions", "body": {"model": "m"}}), "missing_custom_id"),
        (json.dumps({"custom_id": "x", "method": "GET", "url": "/v1/chat/completions", "body": {}}), "invalid_method"),
        (json.dumps({"custom_id": "x", "url": "/v1/images", "body": {"model": "m"}}), "invalid_url"),
        (json.dumps({"custom_id": "x", "url": "/v1/completions", "body": "hi"}), "invalid_body"),
        (json.dumps({"custom_id": "x", "url": "/v1/completions", "body": {"prompt": "hi"}}), "invalid_body"),
        (
            json.dumps({"custom_id": "x", "url": "/v1/completions", "body": {"model": "m", "p": "y" * 2000}}),
            "line_too_long",
        ),
    ],
)
def test_a_bad_line_is_its_own_error_and_the_batch_goes_on(raw: str, code: str) -> None:
    parsed = parse(line("ok") + "\n" + raw + "\n" + line("ok2"))
    assert not parsed.fatal and parsed.total == 3
    bad = parsed.lines[1]
    assert isinstance(bad, LineError) and bad.code == code and bad.index == 1
    assert isinstance(parsed.lines[0], InputLine) and isinstance(parsed.lines[2], InputLine)
    out = error_line(bad)
    assert out["response"] is None and out["error"]["code"] == code and "line 2" in out["error"]["message"]


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"", "empty_file"),
        (b"\n  \n", "empty_file"),
        (b"\xff\xfe not utf-8", "invalid_file"),
        ("\n".join(line(f"c{i}") for i in range(5)).encode(), "too_many_requests"),
        ((line("same") + "\n" + line("other") + "\n" + line("same")).encode(), "duplicate_custom_id"),
    ],
)
def test_what_fails_the_whole_file(data: bytes, code: str) -> None:
    parsed = parse_input(data, max_lines=4, max_line_bytes=1000)
    assert parsed.lines == [] and parsed.fatal[0].code == code
    if code == "duplicate_custom_id":
        assert parsed.fatal[0].line == 3 and "lines 1 and 3" in parsed.fatal[0].message


def test_parsing_is_deterministic_so_a_successor_sees_the_same_indices() -> None:
    text = "\n".join([line("a"), "junk", "", line("b"), line("c")])
    assert parse(text) == parse(text)
    assert [x.index for x in parse(text).lines] == [0, 1, 2, 3]


def test_status_machine_allows_the_openai_paths_only() -> None:
    p = rec.Progress()
    p = rec.advance(p, status="in_progress", total=3)
    p = rec.advance(p, committed=2, completed=2)
    p = rec.advance(p, status="finalizing")
    p = rec.advance(p, status="completed")
    with pytest.raises(rec.InvalidTransition):
        rec.advance(p, status="in_progress")
    with pytest.raises(rec.InvalidTransition):
        rec.advance(rec.Progress(), status="completed")  # validating -> completed skips the work
    with pytest.raises(rec.InvalidTransition):
        rec.advance(rec.Progress(status="in_progress", committed=5), committed=3)  # never back
    assert rec.advance(rec.Progress(), status="failed").status == "failed"
    assert rec.advance(rec.Progress(status="in_progress"), status="cancelled").status == "cancelled"
    assert rec.advance(rec.Progress(status="in_progress"), status="expired").status == "expired"
    for terminal in rec.TERMINAL:
        assert rec.TRANSITIONS[terminal] == frozenset()


def state_with(entries: dict[str, Any]) -> Any:
    return SimpleNamespace(plugin_data={"batch": entries})


SPEC = rec.BatchSpec(
    id="batch_" + "0" * 24,
    endpoint="/v1/chat/completions",
    input_file_id="file-" + "1" * 24,
    created_at=1000,
    created_by="n1",
)


def test_batch_object_shows_cancelling_until_the_runner_finishes() -> None:
    prog = rec.Progress(status="in_progress", total=10, committed=4, completed=3, failed=1, in_progress_at=1001)
    entries = {f"batch/{SPEC.id}": SPEC.model_dump(), f"progress/{SPEC.id}": prog.model_dump()}
    obj = rec.batch_object(state_with(entries), SPEC)
    assert obj["status"] == "in_progress" and obj["expires_at"] == 1000 + 86400
    assert obj["request_counts"] == {"total": 10, "completed": 3, "failed": 1}
    entries[f"cancel/{SPEC.id}"] = {"at": 1005, "by": "n2"}
    obj = rec.batch_object(state_with(entries), SPEC)
    assert obj["status"] == "cancelling" and obj["cancelling_at"] == 1005
    entries[f"progress/{SPEC.id}"] = rec.advance(prog, status="cancelled", cancelled_at=1006).model_dump()
    assert rec.batch_object(state_with(entries), SPEC)["status"] == "cancelled"


def test_the_keeper_moves_a_batch_only_when_its_runner_is_gone() -> None:
    record = rec.FileRecord(
        id=SPEC.input_file_id, bytes=1, created_at=1, filename="f", purpose="batch", sha256="", holders=("n1", "n3")
    )
    entries = {
        f"batch/{SPEC.id}": SPEC.model_dump(),
        f"file/{record.id}": record.model_dump(),
        f"run/{SPEC.id}": {"node": "n1", "generation": 1},
        f"progress/{SPEC.id}": rec.Progress(status="in_progress", generation=1, committed=7).model_dump(),
    }
    state = state_with(entries)
    assert rec.choose_runner(state, SPEC.id, {"n1", "n2", "n3"}, ["n1", "n2", "n3"], "n2") is None
    moved = rec.choose_runner(state, SPEC.id, {"n2", "n3"}, ["n2", "n3"], "n2")
    assert moved is not None and moved.node == "n3" and moved.generation == 2  # n3 holds the input
    assert rec.choose_runner(state, SPEC.id, {"n2"}, [], "n2") is None  # nobody can run it
    entries[f"progress/{SPEC.id}"] = rec.Progress(status="completed").model_dump()
    assert rec.choose_runner(state, SPEC.id, {"n2"}, ["n2"], "n2") is None  # finished: stays


def test_segments_round_trip_and_results_are_sorted_into_output_and_error() -> None:
    good = InputLine(index=0, custom_id="a", url="/v1/chat/completions", body={"model": "m"})
    ok = answer_line(good, 200, {"id": "chatcmpl-1", "choices": []})
    bad = answer_line(good, 400, {"error": {"message": "no such model", "code": "model_not_found"}})
    assert is_ok(ok) and ok["response"]["request_id"] == "chatcmpl-1" and ok["error"] is None
    assert not is_ok(bad) and bad["error"] == {"code": "model_not_found", "message": "no such model"}
    assert bad["response"]["status_code"] == 400
    assert read_segment(segment_bytes([(3, ok), (4, bad)])) == [(3, ok), (4, bad)]
    assert derived_file_id(SPEC.id, "output") == derived_file_id(SPEC.id, "output") != derived_file_id(SPEC.id, "error")


def test_storage_names_cannot_be_paths(tmp_path: Any) -> None:
    storage = Storage(SimpleNamespace(node_id="n1"), tmp_path, 2)  # type: ignore[arg-type]
    for kind, name in [("files", "../x"), ("files", "file-zz"), ("segments", f"{SPEC.id}/../../x"), ("other", "a")]:
        with pytest.raises(StorageError):
            storage.path(kind, name)
    storage.write("segments", f"{SPEC.id}/0-4", b"x")
    assert storage.read_local("segments", f"{SPEC.id}/0-4") == b"x"
    storage.delete_segments(SPEC.id)
    assert not (tmp_path / "segments" / SPEC.id).exists()


def test_batch_lines_step_aside_for_interactive_requests() -> None:
    from skulk_batch.config import BatchConfig
    from skulk_batch.service import lines_allowed

    config = BatchConfig(per_replica=2, busy_in_flight=0)
    # idle replicas: two lines per replica
    assert lines_allowed(set(), set(), 0, 2, config, False, False) == (4, False)
    # only the batch's own (marked) lines are open: still idle
    assert lines_allowed({"b1", "b2"}, {"b1", "b2"}, 2, 2, config, False, False) == (4, False)
    # a line sent but not yet marked is subtracted by count
    assert lines_allowed({"b1", "x"}, {"b1"}, 2, 2, config, False, False) == (4, False)
    # a user's request is open: the batch waits (0 in flight), or runs one line when starving
    assert lines_allowed({"b1", "user"}, {"b1"}, 1, 2, config, False, False) == (0, True)
    assert lines_allowed({"user"}, set(), 0, 2, config, True, False) == (1, True)
    # just after users left: still stepped down for quiet_s
    assert lines_allowed(set(), set(), 0, 2, config, False, True) == (0, False)
    assert lines_allowed({"user"}, set(), 0, 2, BatchConfig(busy_in_flight=1), False, False) == (1, True)


def test_segments_merge_like_a_base_8_counter_so_the_record_stays_small() -> None:
    segments: tuple[rec.Segment, ...] = ()
    merges = 0
    for i in range(4096):  # a slow batch committing one line at a time
        segments = (*segments, rec.Segment(start=i, end=i + 1, holders=("n1",)))
        while (count := rec.to_merge(segments)) > 0:
            parts = segments[-count:]
            merged = rec.Segment(start=parts[0].start, end=parts[-1].end, holders=("n1",), level=parts[0].level + 1)
            segments = (*segments[:-count], merged)
            merges += 1
        assert len(segments) <= 7 * 5
        assert [s.start for s in segments[1:]] == [s.end for s in segments[:-1]]  # contiguous, in order
    assert segments == (rec.Segment(start=0, end=4096, holders=("n1",), level=4),)
    assert merges == 512 + 64 + 8 + 1
