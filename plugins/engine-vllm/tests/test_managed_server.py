"""The managed OpenAI-server layer against a real lightweight server: llama.cpp's, via xllamacpp.

Every test starts real processes and tears them down in `finally`; assertions check the process
table, not our own bookkeeping.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from skulk_engine_vllm.managed import (
    ManagedServer,
    PidRecord,
    ServerError,
    ServerSpec,
    free_port,
    group_members,
    read_exit_records,
    reap_orphans,
)
from skulk_engine_vllm.proxy import LlamaServerCounter, OpenAIServerSession
from skulk_kernel.api import (
    ChatMessage,
    CompletionParams,
    ErrorChunk,
    SamplingParams,
    TextGenerationParams,
    TokenChunk,
    is_terminal,
)

HERE = Path(__file__).parent
pytestmark = pytest.mark.timeout(180)


def llama_spec(model: Path, run_dir: Path, key: str = "runner-a", *extra: str) -> ServerSpec:
    port = free_port()
    return ServerSpec(
        name="llama.cpp",
        argv=[sys.executable, str(HERE / "xllamacpp_server.py"), str(model), str(port), *extra],
        port=port,
        run_dir=run_dir,
        key=key,
        labels={"instance_id": "inst-1"},
        log_path=run_dir / f"{key}.log",
        ready_timeout_s=120,
        stop_grace_s=5,
    )


def stubborn_spec(run_dir: Path, key: str = "stubborn") -> ServerSpec:
    """A real HTTP server that ignores SIGTERM (a hung server): teardown must escalate to SIGKILL."""
    port = free_port()
    code = (
        "import runpy, signal, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"sys.argv = ['http.server', '{port}', '--bind', '127.0.0.1']; "
        "runpy.run_module('http.server', run_name='__main__')"
    )
    return ServerSpec(
        name="stubborn",
        argv=[sys.executable, "-c", code],
        port=port,
        run_dir=run_dir,
        key=key,
        health_path="/",
        stop_grace_s=1.0,
        ready_timeout_s=30,
    )


def params(text: str, max_tokens: int = 24) -> TextGenerationParams:
    return TextGenerationParams(
        model_id="m",
        messages=(ChatMessage(role="user", content=text),),
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0),
    )


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def llama(smollm2_gguf: Path, tmp_path: Path) -> Iterator[tuple[ManagedServer, OpenAIServerSession]]:
    pytest.importorskip("xllamacpp")
    exits: list[str] = []
    server = ManagedServer(llama_spec(smollm2_gguf, tmp_path), on_exit=exits.append)
    server.start()
    session = OpenAIServerSession(
        server.base_url,
        "smollm2",
        tag="llama_server-cpu",
        engine_label="llama.cpp",
        counter=LlamaServerCounter(),
        alive=lambda: server.exit_reason,
        close=server.stop,
    )
    try:
        yield server, session
    finally:
        session.close()


def test_start_records_the_server_and_streams_chat(llama: tuple[ManagedServer, OpenAIServerSession]) -> None:
    server, session = llama
    record = PidRecord.model_validate_json(server.pid_file.read_text())
    assert record.pid == server.proc.pid and record.owner_pid == os.getpid()
    assert os.getpgid(record.pid) == record.pid  # its own process group
    chunks = list(session.generate("c1", params("Say hello in one short sentence.", 16), lambda: False))
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    assert sum(is_terminal(c) for c in chunks) == 1 and is_terminal(chunks[-1])
    text = "".join(c.text for c in chunks if isinstance(c, TokenChunk))
    assert text.strip(), chunks
    final = chunks[-1]
    assert final.finish_reason in ("stop", "length") and final.usage and final.usage.completion_tokens > 0
    assert session.count_tokens(params("Say hello")) > 3


def test_max_tokens_ends_with_length(llama: tuple[ManagedServer, OpenAIServerSession]) -> None:
    _, session = llama
    chunks = list(session.generate("c2", params("Write a long story about a fox.", 5), lambda: False))
    assert chunks[-1].finish_reason == "length" and chunks[-1].usage.completion_tokens == 5


def test_cancel_closes_the_request_and_frees_the_slot(llama: tuple[ManagedServer, OpenAIServerSession]) -> None:
    _server, session = llama
    seen = 0
    flag = {"on": False}
    started = time.monotonic()
    chunks = []
    for chunk in session.generate("c3", params("Count from one to two hundred in words.", 400), lambda: flag["on"]):
        chunks.append(chunk)
        seen += 1
        if seen == 3:
            flag["on"] = True
    assert chunks[-1].finish_reason == "cancelled" and len(chunks) <= 8
    assert time.monotonic() - started < 30
    # the server noticed the closed connection: no slot keeps decoding
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        slots = session.http.get("/slots").json()
        if not any(s.get("is_processing") for s in slots):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"a slot is still processing after cancel: {slots}")


def test_cancel_before_the_first_token(llama: tuple[ManagedServer, OpenAIServerSession]) -> None:
    _, session = llama
    started = time.monotonic()
    chunks = list(session.generate("c4", params("Tell me about rivers. " * 40, 200), lambda: True))
    assert chunks[-1].finish_reason == "cancelled"
    assert time.monotonic() - started < 5


def test_stop_leaves_no_process_and_no_pid_file(smollm2_gguf: Path, tmp_path: Path) -> None:
    pytest.importorskip("xllamacpp")
    server = ManagedServer(llama_spec(smollm2_gguf, tmp_path)).start()
    pid = server.proc.pid
    try:
        assert group_members(pid)
    finally:
        server.stop()
    assert gone(pid) and not group_members(pid)
    assert not server.pid_file.exists() and not server.exit_file.exists()


def test_stop_escalates_to_sigkill(tmp_path: Path) -> None:
    server = ManagedServer(stubborn_spec(tmp_path)).start()
    pid = server.proc.pid
    started = time.monotonic()
    server.stop()
    assert gone(pid) and time.monotonic() - started < 10


def test_kill_9_is_recorded_with_the_reason(llama: tuple[ManagedServer, OpenAIServerSession]) -> None:
    server, session = llama
    os.kill(server.proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while server.exit_reason is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.exit_reason and "killed by SIGKILL" in server.exit_reason
    records = read_exit_records(server.spec.run_dir)
    assert len(records) == 1 and records[0][1].labels == {"instance_id": "inst-1"}
    assert "SIGKILL" in records[0][1].reason
    assert not server.pid_file.exists()
    chunks = list(session.generate("c5", params("hi"), lambda: False))
    assert len(chunks) == 1 and isinstance(chunks[0], ErrorChunk) and "SIGKILL" in chunks[0].message


def test_kill_9_mid_stream_ends_the_stream_with_the_reason(llama: tuple[ManagedServer, OpenAIServerSession]) -> None:
    server, session = llama
    chunks = []
    for chunk in session.generate("c6", params("Count from one to two hundred in words.", 400), lambda: False):
        chunks.append(chunk)
        if len(chunks) == 2:
            os.kill(server.proc.pid, signal.SIGKILL)
    assert isinstance(chunks[-1], ErrorChunk), chunks[-3:]
    deadline = time.monotonic() + 5
    while server.exit_reason is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.exit_reason is not None


def test_a_server_that_dies_while_loading_says_why(tmp_path: Path) -> None:
    spec = llama_spec(tmp_path / "missing.gguf", tmp_path)
    with pytest.raises(ServerError, match="before it was ready"):
        ManagedServer(spec).start()
    assert not (tmp_path / "runner-a.pid.json").exists()


OWNER = textwrap.dedent(
    """
    import sys, time
    sys.path[:0] = {paths!r}
    from pathlib import Path
    from skulk_engine_vllm.managed import ServerSpec, ManagedServer
    spec = ServerSpec.model_validate_json(Path({spec!r}).read_text())
    server = ManagedServer(spec).start()
    print(server.proc.pid, flush=True)
    time.sleep(600)
    """
)


def test_orphan_of_a_crashed_owner_is_reaped_at_the_next_start(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    spec = stubborn_spec(run_dir, key="orphan")
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(spec.model_dump_json())
    script = OWNER.format(paths=sys.path, spec=str(spec_file))
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    server_pid = None
    try:
        assert owner.stdout is not None
        server_pid = int(owner.stdout.readline())
        assert reap_orphans(run_dir) == []  # the owner lives: not an orphan
        assert not gone(server_pid)
        owner.kill()  # the runner crashes without tearing its server down
        owner.wait(10)
        time.sleep(0.5)
        assert not gone(server_pid), "the stubborn server should have survived its owner"
        reaped = reap_orphans(run_dir, grace_s=1.0)
        assert [r.pid for r in reaped] == [server_pid]
        assert gone(server_pid) and not list(run_dir.glob("*.pid.json"))
    finally:
        owner.kill()
        if server_pid is not None and not gone(server_pid):
            os.killpg(server_pid, signal.SIGKILL)


def test_a_server_dies_with_its_owner(smollm2_gguf: Path, tmp_path: Path) -> None:
    """PR_SET_PDEATHSIG: a runner killed outright takes its (well-behaved) server along."""
    pytest.importorskip("xllamacpp")
    spec = llama_spec(smollm2_gguf, tmp_path, "owned")
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(spec.model_dump_json())
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER.format(paths=sys.path, spec=str(spec_file))], stdout=subprocess.PIPE, text=True
    )
    server_pid = None
    try:
        assert owner.stdout is not None
        server_pid = int(owner.stdout.readline())
        owner.kill()
        owner.wait(10)
        deadline = time.monotonic() + 15
        while not gone(server_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert gone(server_pid)
    finally:
        owner.kill()
        if server_pid is not None and not gone(server_pid):
            os.killpg(server_pid, signal.SIGKILL)


def completion(prompt: str | tuple[int, ...], max_tokens: int = 8, **extra: Any) -> TextGenerationParams:
    text = prompt if isinstance(prompt, str) else None
    ids = () if isinstance(prompt, str) else prompt
    return TextGenerationParams(
        model_id="m",
        messages=(ChatMessage(role="user", content=text or ""),),
        raw_prompt=text,
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0),
        logprobs=True,
        top_logprobs=2,
        completion=CompletionParams(prompt_ids=ids, **extra),
    )


def test_text_completions_from_text_or_ids_and_fim_or_echo_refused(
    llama: tuple[ManagedServer, OpenAIServerSession],
) -> None:
    """The prompt as is (no template), as text or token ids, through the server's /v1/completions;
    the same greedy text either way, with logprobs; what needs llama.cpp's native endpoints is a 400."""
    _, session = llama
    assert session.serves_completions
    as_text = list(session.generate("t1", completion("The capital of France is"), lambda: False))
    ids = tuple(session.http.post("/tokenize", json={"content": "The capital of France is"}).json()["tokens"])
    as_ids = list(session.generate("t2", completion(ids), lambda: False))
    texts = ["".join(c.text for c in chunks if isinstance(c, TokenChunk)) for chunks in (as_text, as_ids)]
    assert texts[0].strip() and texts[0] == texts[1], texts
    assert as_text[-1].finish_reason == "length" and as_text[-1].usage.completion_tokens == 8
    assert any(c.logprobs and c.logprobs[0].top_logprobs for c in as_text if isinstance(c, TokenChunk))
    assert session.count_tokens(completion(ids)) == len(ids)
    for extra in ({"suffix": " is Paris."}, {"echo": True}, {"echo": True, "generate": False}):
        (refused,) = session.generate("t3", completion("fn main() {", **extra), lambda: False)
        assert isinstance(refused, ErrorChunk) and refused.error_type == "invalid_request_error", refused
        assert "llamacpp" in refused.message, refused.message
