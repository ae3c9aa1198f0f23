"""No engine carries methods that only refuse a task: it implements the session Protocol of each kind it
serves and leaves the rest out (the runner answers other kinds). `refusal_stubs` is the AST check;
this runs it over every engine plugin's sources so the stubs cannot come back."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from skulk_testing.conformance import refusal_stubs

ROOT = Path(__file__).resolve().parents[2]
ENGINE_PACKAGES = sorted(
    path.parent
    for path in [*ROOT.glob("plugins/*/src/*/plugin.py"), *ROOT.glob("tests/thirdparty/*/src/*/plugin.py")]
    if "def register_engines" in path.read_text()
)


def test_the_engine_plugins_are_found() -> None:
    names = {p.name for p in ENGINE_PACKAGES}
    assert {
        "skulk_engine_echo",
        "skulk_engine_llamacpp",
        "skulk_engine_mlx",
        "skulk_engine_vllm",
        "skulk_engine_diffusers",
        "skulk_speech",
        "skulk_video_comfyui",
    } <= names


@pytest.mark.parametrize("package", ENGINE_PACKAGES, ids=lambda p: p.name)
def test_no_engine_method_only_refuses(package: Path) -> None:
    stubs = [
        stub
        for path in sorted(package.rglob("*.py"))
        for stub in refusal_stubs(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert not stubs, f"methods that only refuse a task (leave the kind's method out instead): {stubs}"


STUBS = '''
class Session:
    def generate(self, command_id, params, cancelled):
        """The text half, which this model does not serve."""
        yield _error(command_id, "this is a speech model: it does not generate text", "unsupported_task")

    def embed(self, command_id, params):
        return ErrorChunk(command_id=command_id, seq=0, message="engine mlx serves text generation only")

    def count_tokens(self, params):
        return 0

    def generate_video(self, command_id, params, cancelled):
        raise NotImplementedError

    def transcribe(self, command_id, params, cancelled):
        raise RuntimeError(f"{self.name}: transcription is not supported")

    def synthesize(self, command_id, params, cancelled):
        ...

    def generate_image(self, command_id, params, cancelled):
        """Images are for another engine."""
'''

REAL = """
class Session:
    def generate(self, command_id, params, cancelled):
        yield from self.backend.stream(params)

    def embed(self, command_id, params):
        if not params.inputs:
            return _error(command_id, "inputs are empty", "empty_input")
        return EmbeddingChunk(command_id=command_id, seq=0, embeddings=self.backend.embed(params.inputs))

    def count_tokens(self, params):
        return len(self.tokenize(params))

    def close(self):
        return None

    def _unused(self):
        pass


class TextSession(Protocol):
    def generate(self, command_id, params, cancelled): ...
"""


def test_refusal_stubs_finds_each_kind_of_stub() -> None:
    found = refusal_stubs(textwrap.dedent(STUBS), "stubs.py")
    assert [f.split(" ", 1)[1] for f in found] == [
        "Session.generate",
        "Session.embed",
        "Session.count_tokens",
        "Session.generate_video",
        "Session.transcribe",
        "Session.synthesize",
        "Session.generate_image",
    ]
    assert found[0].startswith("stubs.py:3 ")


def test_refusal_stubs_leaves_real_methods_and_protocols_alone() -> None:
    assert refusal_stubs(textwrap.dedent(REAL)) == []
