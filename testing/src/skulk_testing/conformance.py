"""Conformance suites: one per contract in `skulk_kernel.contracts`, plus one for plugins as such.

A plugin proves it honours a contract by subclassing the suite in its own tests and providing the
fixture(s) the suite asks for; every test of the suite then runs against that implementation.
(One module past 500 lines on purpose: a plugin author imports every suite from one place, and
the suites share the runner-spec and stub-scanning helpers.)

    from skulk_testing.conformance import EngineConformance, make_runner_spec

    class TestEchoEngine(EngineConformance):
        @pytest.fixture(scope="class")
        @classmethod
        def engine(cls):
            return EchoEngine()

        @pytest.fixture(scope="class")
        @classmethod
        def runner_spec(cls):
            return make_runner_spec(echo_cards()["skulk/echo"])

Suites (and the fixtures a subclass must provide):

* `PluginConformance`           `plugin_name` (class attribute): entry point, no heavy imports,
                                hookimpls match the specs, config model has defaults
* `EngineConformance`           `engine`, `runner_spec` (class-scoped classmethods); optional
                                `embedding_runner_spec`, `rerank_runner_spec`, `facts`. Besides the text tests (skipped
                                for an engine without TextGeneration), a loaded session must
                                implement the session Protocol of every kind in `engine.tasks`, and
                                no method of the engine's classes may only refuse (`refusal_stubs`)
* `PlannerConformance`          `planner`; optional `card`, `backend`
* `ModelStoreConformance`       `store`
* `TransportConformance`        `transport` (a fresh, unstarted instance); optional
                                `transport_options`, `node_id`
* `ElectionConformance`         `election` (fresh, unstarted)
* `ApiAdapterConformance`       `adapter`, `request_body`
* `InferenceMiddlewareConformance`  `middleware`; optional `command`

Class attributes tune the suites for slow or unusual implementations (prompts, timeouts, slack).
Suite classes are not named `Test*`, so pytest only collects them through a subclass.
"""

from __future__ import annotations

import ast
import asyncio
import copy
import datetime as dt
import importlib
import inspect
import itertools
import json
import math
import os
import pickle
import re
import subprocess
import sys
import threading
import time
import typing
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, TypeAdapter
from skulk_kernel.api import (
    SESSION_PROTOCOLS,
    ApiAdapter,
    ChatMessage,
    Chunk,
    ChunkBase,
    Command,
    CompletionParams,
    Connection,
    Election,
    EmbeddingChunk,
    EmbeddingParams,
    EmbeddingSession,
    Engine,
    EngineProbe,
    EngineSession,
    ErrorChunk,
    FinishReason,
    IndexedEvent,
    InferenceMiddleware,
    InstanceCreated,
    ModelCard,
    ModelStore,
    ModelTask,
    NodeCapacity,
    NodeJoined,
    PipelineShardMetadata,
    PlacementError,
    PlacementRequest,
    Planner,
    PromptChunk,
    RerankParams,
    RerankSession,
    RingInstance,
    RunnerSpec,
    SamplingParams,
    ScoreChunk,
    State,
    TextGeneration,
    TextGenerationParams,
    TokenChunk,
    ToolCallChunk,
    Topic,
    TopologyEdgeCreated,
    Transport,
    Usage,
    codec,
    is_terminal,
    serves_completions,
)

__all__ = [
    "HEAVY_MODULES",
    "ApiAdapterConformance",
    "ElectionConformance",
    "EngineConformance",
    "Inbox",
    "InferenceMiddlewareConformance",
    "ModelStoreConformance",
    "PlannerConformance",
    "PluginConformance",
    "TransportConformance",
    "make_runner_spec",
    "refusal_stubs",
]

HEAVY_MODULES = ("torch", "mlx", "vllm", "llama_cpp", "zenoh", "libp2p", "transformers", "numpy")
_CHUNK = TypeAdapter(Chunk)
_COMMAND = TypeAdapter(Command)
_MODEL_TASKS = frozenset(typing.get_args(ModelTask))
_FINISH_REASONS = frozenset(typing.get_args(FinishReason))
_EPOCH = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)


def make_runner_spec(
    card: ModelCard,
    model_path: Path | None = None,
    *,
    backend: str = "",
    options: dict[str, Any] | None = None,
    instance_id: str = "conformance-instance",
    runner_id: str = "conformance-runner",
) -> RunnerSpec:
    """A single-runner RunnerSpec holding every layer of `card` (what a one-node placement gives)."""
    shard = PipelineShardMetadata(
        model_id=card.model_id,
        device_rank=0,
        world_size=1,
        start_layer=0,
        end_layer=card.n_layers,
        n_layers=card.n_layers,
        backend=backend or (card.compatible_backends[:1] or ("any",))[0],
    )
    return RunnerSpec(
        instance_id=instance_id,
        runner_id=runner_id,
        shard=shard,
        card=card,
        model_path=model_path,
        options=dict(options or {}),
    )


# ============================== plugins ==========================================================


class PluginConformance:
    """Any plugin: set `plugin_name` to its entry-point name (``engine-echo``).

    A plugin that implements hooks another plugin declares (``register_api_routes`` is
    api-control's) names the declaring plugins in `hook_owners`; they are loaded first.
    """

    plugin_name: str = ""
    heavy_modules: tuple[str, ...] = HEAVY_MODULES
    hook_owners: tuple[str, ...] = ()

    @pytest.fixture
    def info(self) -> Any:
        from skulk_kernel.api import installed_plugins

        assert self.plugin_name, f"{type(self).__name__} must set plugin_name"
        plugins = installed_plugins()
        assert self.plugin_name in plugins, (
            f"no installed distribution has entry point {self.plugin_name!r} in group skulk.plugins "
            f"(installed: {sorted(plugins)})"
        )
        return plugins[self.plugin_name]

    def test_name_follows_kind_name_pattern(self, info: Any) -> None:
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", self.plugin_name), (
            f"plugin names are <kind>-<name> (or one word for a role) in lower case, got {self.plugin_name!r}"
        )

    def test_declares_a_compatible_kernel_range(self, info: Any) -> None:
        from skulk_kernel.api import kernel_version

        assert info.kernel_range, f"{info.distribution} must depend on skulk-kernel with a version range"
        assert info.kernel_compatible(kernel_version()), (
            f"{info.distribution} requires skulk-kernel{info.kernel_range}, running {kernel_version()}"
        )

    def test_entry_point_imports_no_heavy_library(self, info: Any) -> None:
        probe = (
            "import importlib, json, sys\n"
            f"importlib.import_module({info.module.split(':')[0]!r})\n"
            "print('@@' + json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
        )
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        imported = set(json.loads(out.stdout.split("@@", 1)[1]))
        heavy = sorted(imported & set(self.heavy_modules))
        assert not heavy, f"importing {info.module} imported {heavy}; import them inside functions"

    def test_hookimpls_match_the_hookspecs(self, info: Any) -> None:
        from skulk_kernel.api import Profile, build_plugin_manager

        pm = build_plugin_manager(Profile(name="conformance", plugins=(*self.hook_owners, self.plugin_name)))
        plugin = pm.get_plugin(self.plugin_name)
        callers = pm.get_hookcallers(plugin) or []
        assert callers, f"{info.module} implements no hook (is @hookimpl from skulk_kernel missing?)"
        unknown = sorted(caller.name for caller in callers if caller.spec is None)
        assert not unknown, (
            f"hookimpls without a hookspec: {unknown} (a typo, or hooks another plugin declares: "
            f"name it in hook_owners, e.g. hook_owners = ('api-control',) for register_api_routes)"
        )
        pm.check_pending()  # argument names must be a subset of each spec's

    def test_config_model_has_defaults(self, info: Any) -> None:
        from skulk_kernel.api import Profile, build_plugin_manager

        pm = build_plugin_manager(Profile(name="conformance", plugins=(self.plugin_name,)))
        models: dict[str, type[BaseModel]] = {}
        pm.hook.register_config(register=lambda name, model: models.__setitem__(name, model))
        for name, model in models.items():
            assert name == self.plugin_name, f"config registered under {name!r}, not {self.plugin_name!r}"
            assert issubclass(model, BaseModel)
            model()  # a profile without a [plugins.NAME] table must still start


# ============================== engines ==========================================================


@dataclass
class LoadedSession:
    session: Any
    progress: list[tuple[int, int]] = field(default_factory=list)


# a session implements the Protocol of each kind it serves, and no method that only refuses: the
# runner answers a kind the session lacks ("engine X does not serve <kind>"), so these never return
_REFUSAL = re.compile(
    r"not supported|unsupported|not implemented|does not (serve|support|generate|embed|make|synthesi[sz]e|transcribe)"
    r"|\bserves\b.*\bonly\b",
    re.IGNORECASE,
)
_SESSION_METHODS = frozenset(
    name for proto in SESSION_PROTOCOLS.values() for name in vars(proto) if not name.startswith("_")
)


def _only_statement(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.stmt | None:
    body = fn.body
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        body = body[1:]  # the docstring
    if not body:
        return ast.Pass()  # a docstring alone does nothing either
    return body[0] if len(body) == 1 else None


def _refuses(stmt: ast.stmt) -> bool:
    """`raise NotImplementedError`, or a raise / return / yield whose text says it does not serve."""
    if isinstance(stmt, ast.Raise):
        exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
        if isinstance(exc, ast.Name) and exc.id == "NotImplementedError":
            return True
        value: ast.AST | None = stmt.exc
    elif isinstance(stmt, ast.Return):
        value = stmt.value
    elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Yield | ast.YieldFrom):
        value = stmt.value.value
    else:
        return False
    return value is not None and any(
        isinstance(n, ast.Constant) and isinstance(n.value, str) and _REFUSAL.search(n.value) for n in ast.walk(value)
    )


def _placeholder(stmt: ast.stmt) -> bool:
    """`pass`, `...`, `return`, `return None/0/""`: a session method that does nothing."""
    if isinstance(stmt, ast.Pass):
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and stmt.value.value is Ellipsis:
        return True
    if isinstance(stmt, ast.Return):
        return stmt.value is None or (isinstance(stmt.value, ast.Constant) and stmt.value.value in (None, 0, ""))
    return False


def refusal_stubs(source: str, filename: str = "<source>") -> list[str]:
    """Methods in `source` that exist only to refuse: `file:line Class.method` for each.

    A stub is a method of a class (not a Protocol) whose body, past its docstring, is one
    `raise NotImplementedError`, or one raise / return / yield whose message says the task is not
    served ("not supported", "unsupported", "does not embed"...), or, for a session method
    (generate, embed, synthesize...), nothing at all (`pass`, `...`, `return 0`). An engine serves a
    task kind by implementing its Protocol and leaves the others out.
    """
    found = []
    for cls in ast.walk(ast.parse(source, filename)):
        if not isinstance(cls, ast.ClassDef):
            continue
        if any(isinstance(b, ast.Name | ast.Attribute) and ast.unparse(b).endswith("Protocol") for b in cls.bases):
            continue
        for fn in cls.body:
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            stmt = _only_statement(fn)
            if stmt is not None and (_refuses(stmt) or (fn.name in _SESSION_METHODS and _placeholder(stmt))):
                found.append(f"{filename}:{fn.lineno} {cls.name}.{fn.name}")
    return found


def _engine_sources(*objects: Any) -> list[Path]:
    """The files of each object's class (and its bases), and of the package each class comes from."""
    files: set[Path] = set()
    for obj in objects:
        for klass in type(obj).__mro__:
            if klass.__module__ in ("builtins", "typing"):
                continue
            try:
                files.add(Path(inspect.getsourcefile(klass) or ""))
            except TypeError:
                continue
            try:
                top = importlib.import_module(klass.__module__.split(".")[0])
            except ImportError:
                continue
            if getattr(top, "__path__", None) and top.__file__:  # a package: all of it
                files.update(Path(top.__file__).parent.rglob("*.py"))
    return sorted(f for f in files if f.suffix == ".py" and f.is_file())


class EngineConformance:
    """An Engine and the sessions it loads. Fixtures are class-scoped: each model loads once."""

    prompt = (
        "Count from one to thirty in words, separated by spaces: one two three four five six "
        "seven eight nine ten eleven twelve"
    )
    short_prompt = "Hi"
    max_tokens_limit = 2
    cancel_slack = 3  # chunks an engine may still emit after it sees cancelled() turn true
    embed_inputs: tuple[str, ...] = ("the quick brown fox", "a lazy dog", "the quick brown fox")

    # ---------------------------------------------------------------- fixtures to provide

    @pytest.fixture(scope="class")
    @classmethod
    def engine(cls) -> Any:
        raise NotImplementedError("subclass EngineConformance and provide an `engine` fixture")

    @pytest.fixture(scope="class")
    @classmethod
    def runner_spec(cls) -> RunnerSpec:
        raise NotImplementedError(
            "subclass EngineConformance and provide a `runner_spec` fixture "
            "(make_runner_spec(card, model_path) builds one)"
        )

    @pytest.fixture(scope="class")
    @classmethod
    def embedding_runner_spec(cls) -> RunnerSpec | None:
        """A spec for an embedding model, when the engine lists TextEmbedding in `tasks`."""
        return None

    @pytest.fixture(scope="class")
    @classmethod
    def rerank_runner_spec(cls) -> RunnerSpec | None:
        """A spec for a reranking model, when the engine lists TextRerank in `tasks`."""
        return None

    @pytest.fixture(scope="class")
    @classmethod
    def facts(cls) -> dict[str, Any]:
        """Node facts passed to backend_tags (what probe_node hooks gathered)."""
        return {}

    # ---------------------------------------------------------------- derived fixtures

    @pytest.fixture(scope="class")
    @classmethod
    def probe(cls, engine: Any) -> EngineProbe:
        return engine.probe()

    @pytest.fixture(scope="class")
    @classmethod
    def any_loaded(cls, engine: Any, runner_spec: RunnerSpec, probe: EngineProbe) -> Iterator[LoadedSession]:
        """The session `runner_spec` loads, whatever kinds of task its engine serves."""
        if not probe.available:
            pytest.skip(f"engine {engine.name} is not available here: {probe.reason}")
        loaded = LoadedSession(session=None)
        loaded.session = engine.load(runner_spec, lambda done, total: loaded.progress.append((done, total)))
        yield loaded
        loaded.session.close()

    @pytest.fixture(scope="class")
    @classmethod
    def loaded(cls, engine: Any, runner_spec: RunnerSpec, any_loaded: LoadedSession) -> LoadedSession:
        """The same session, for the text generation tests."""
        if "TextGeneration" not in engine.tasks and "TextGeneration" not in runner_spec.card.tasks:
            pytest.skip("not a text generation engine")
        return any_loaded

    @pytest.fixture(scope="class")
    @classmethod
    def embedding_session(
        cls, engine: Any, runner_spec: RunnerSpec, embedding_runner_spec: RunnerSpec | None, probe: EngineProbe
    ) -> Iterator[tuple[Any, RunnerSpec]]:
        if "TextEmbedding" not in engine.tasks:
            pytest.skip("not an embedding engine")
        if not probe.available:
            pytest.skip(f"engine {engine.name} is not available here: {probe.reason}")
        spec = embedding_runner_spec or runner_spec
        if "TextEmbedding" not in spec.card.tasks:
            pytest.skip("provide `embedding_runner_spec` for an embedding model")
        session = engine.load(spec, lambda done, total: None)
        yield session, spec
        session.close()

    @pytest.fixture(scope="class")
    @classmethod
    def rerank_session(
        cls, engine: Any, rerank_runner_spec: RunnerSpec | None, probe: EngineProbe
    ) -> Iterator[tuple[Any, RunnerSpec]]:
        if "TextRerank" not in engine.tasks:
            pytest.skip("not a reranking engine")
        if not probe.available:
            pytest.skip(f"engine {engine.name} is not available here: {probe.reason}")
        if rerank_runner_spec is None or "TextRerank" not in rerank_runner_spec.card.tasks:
            pytest.skip("provide `rerank_runner_spec` for a reranking model")
        session = engine.load(rerank_runner_spec, lambda done, total: None)
        yield session, rerank_runner_spec
        session.close()

    # ---------------------------------------------------------------- helpers

    @staticmethod
    def params(spec: RunnerSpec, text: str, **sampling: Any) -> TextGenerationParams:
        return TextGenerationParams(
            model_id=spec.card.model_id,
            messages=(ChatMessage(role="user", content=text),),
            sampling=SamplingParams(temperature=0.0, **sampling),
        )

    @staticmethod
    def collect(
        session: Any,
        command_id: str,
        params: TextGenerationParams,
        cancelled: Callable[[], bool] = lambda: False,
        limit: int = 10_000,
    ) -> list[Chunk]:
        chunks = []
        for chunk in session.generate(command_id, params, cancelled):
            chunks.append(chunk)
            assert len(chunks) <= limit, f"generate produced more than {limit} chunks"
        return chunks

    def assert_well_formed(self, chunks: list[Chunk], command_id: str) -> Chunk:
        assert chunks, "generate yielded nothing"
        for chunk in chunks:
            assert isinstance(chunk, ChunkBase), f"generate yielded {type(chunk).__name__}, not a chunk"
            assert chunk.command_id == command_id
            assert codec.decode_union(codec.encode(chunk), _CHUNK) == chunk  # travels on the data plane
        seqs = [c.seq for c in chunks]
        assert seqs == list(range(len(chunks))), f"seq must count 0, 1, 2... without gaps, got {seqs}"
        terminal = [i for i, c in enumerate(chunks) if is_terminal(c)]
        assert terminal == [len(chunks) - 1], f"exactly one terminal chunk, last; got positions {terminal}"
        final = chunks[-1]
        assert final.finish_reason in _FINISH_REASONS
        return final

    # ---------------------------------------------------------------- the engine object

    def test_declares_the_engine_contract(self, engine: Any) -> None:
        assert isinstance(engine, Engine), "missing attributes or methods of contracts.Engine"
        assert isinstance(engine.name, str) and re.fullmatch(r"[a-z0-9_]+", engine.name), engine.name
        assert isinstance(engine.tasks, frozenset) and engine.tasks, "tasks: a non-empty frozenset"
        assert engine.tasks <= _MODEL_TASKS, f"unknown tasks {sorted(engine.tasks - _MODEL_TASKS)}"
        assert isinstance(engine.dispatch_width, int) and engine.dispatch_width >= 1

    def test_probe(self, probe: EngineProbe) -> None:
        assert isinstance(probe, EngineProbe)
        assert isinstance(probe.available, bool) and isinstance(probe.version, str)
        if not probe.available:
            assert probe.reason, "an unavailable engine says why (and how to fix it)"

    def test_backend_tags(self, engine: Any, facts: dict[str, Any]) -> None:
        before = copy.deepcopy(facts)
        tags = engine.backend_tags(facts)
        assert isinstance(tags, list)
        for tag in tags:
            assert isinstance(tag, str) and re.fullmatch(rf"{re.escape(engine.name)}-[a-z0-9_.]+", tag), (
                f"backend tags are '<engine>-<compute>' ({engine.name}-cpu, {engine.name}-cuda...), got {tag!r}"
            )
        assert len(tags) == len(set(tags)), f"duplicate tags {tags}"
        assert facts == before, "backend_tags must not change the facts"

    def test_runner_spec_is_picklable(self, runner_spec: RunnerSpec) -> None:
        assert pickle.loads(pickle.dumps(runner_spec)) == runner_spec  # it crosses into the runner

    # ---------------------------------------------------------------- loading

    def test_no_method_only_refuses(self, engine: Any) -> None:
        stubs = [stub for path in _engine_sources(engine) for stub in refusal_stubs(path.read_text(), str(path))]
        assert not stubs, (
            "methods that only refuse a task (serve a kind by implementing its session Protocol, "
            f"and leave the others out; the runner refuses them): {stubs}"
        )

    def test_load_reports_progress(self, any_loaded: LoadedSession) -> None:
        loaded = any_loaded
        assert loaded.progress, "load() must call progress(done, total) at least once"
        done_seen = [d for d, _ in loaded.progress]
        assert done_seen == sorted(done_seen), f"progress went backwards: {loaded.progress}"
        for done, total in loaded.progress:
            assert isinstance(done, int) and isinstance(total, int)
            assert 0 <= done <= total and total > 0, (done, total)
        done, total = loaded.progress[-1]
        assert done == total, f"the last progress call reports completion, got {(done, total)}"

    def test_session_contract(self, any_loaded: LoadedSession) -> None:
        assert isinstance(any_loaded.session, EngineSession), "missing methods of contracts.EngineSession"

    def test_session_serves_every_declared_kind(self, engine: Any, any_loaded: LoadedSession) -> None:
        missing = {
            kind: SESSION_PROTOCOLS[kind].__name__
            for kind in sorted(engine.tasks & SESSION_PROTOCOLS.keys())
            if not isinstance(any_loaded.session, SESSION_PROTOCOLS[kind])
        }
        assert not missing, f"engine {engine.name} declares tasks its session does not implement: {missing}"

    def test_session_has_no_refusal_stubs(self, any_loaded: LoadedSession) -> None:
        stubs = [s for path in _engine_sources(any_loaded.session) for s in refusal_stubs(path.read_text(), str(path))]
        assert not stubs, f"session methods that only refuse a task: {stubs}"

    # ---------------------------------------------------------------- generation

    def test_generate_stream_is_well_formed(self, loaded: LoadedSession, runner_spec: RunnerSpec) -> None:
        chunks = self.collect(loaded.session, "conf-gen", self.params(runner_spec, self.prompt))
        final = self.assert_well_formed(chunks, "conf-gen")
        assert not isinstance(final, ErrorChunk), f"generation failed: {final}"
        text = "".join(c.text for c in chunks if isinstance(c, TokenChunk))
        assert text or any(isinstance(c, ToolCallChunk) for c in chunks), "no output at all"
        assert isinstance(final.usage, Usage), "the terminal chunk carries usage"
        assert final.usage.prompt_tokens > 0 and final.usage.completion_tokens >= 0

    def test_generate_twice_on_one_session(self, loaded: LoadedSession, runner_spec: RunnerSpec) -> None:
        for command_id in ("conf-again-1", "conf-again-2"):
            chunks = self.collect(loaded.session, command_id, self.params(runner_spec, self.short_prompt))
            self.assert_well_formed(chunks, command_id)

    def test_max_tokens_finishes_with_length(self, loaded: LoadedSession, runner_spec: RunnerSpec) -> None:
        limit = self.max_tokens_limit
        params = self.params(runner_spec, self.prompt, max_tokens=limit)
        chunks = self.collect(loaded.session, "conf-len", params)
        final = self.assert_well_formed(chunks, "conf-len")
        assert final.finish_reason == "length", f"max_tokens={limit} must end with 'length', got {final}"
        if final.usage is not None:
            assert final.usage.completion_tokens <= limit
        assert sum(1 for c in chunks if isinstance(c, TokenChunk) and c.text) <= limit

    def test_cancellation_stops_early(self, loaded: LoadedSession, runner_spec: RunnerSpec) -> None:
        params = self.params(runner_spec, self.prompt)
        full = self.collect(loaded.session, "conf-full", params)
        flag = threading.Event()
        chunks: list[Chunk] = []
        for chunk in loaded.session.generate("conf-cancel", params, flag.is_set):
            chunks.append(chunk)
            flag.set()  # the client went away after the first chunk
            assert len(chunks) <= 1 + self.cancel_slack + 1, "generation did not stop after cancelled()"
        self.assert_well_formed(chunks, "conf-cancel")
        assert len(chunks) < len(full), "a cancelled stream must be shorter than an uncancelled one"

    def test_count_tokens(self, loaded: LoadedSession, runner_spec: RunnerSpec) -> None:
        short = loaded.session.count_tokens(self.params(runner_spec, self.short_prompt))
        long = loaded.session.count_tokens(self.params(runner_spec, self.prompt))
        assert isinstance(short, int) and short > 0
        assert long >= short

    def test_text_completion_when_served(self, loaded: LoadedSession, runner_spec: RunnerSpec) -> None:
        """A session that says it serves completions (`CompletionInput`) reads the prompt as is: the echo
        (one PromptChunk, the prompt's text, a logprob per token when asked) comes before any token."""
        if not serves_completions(loaded.session):
            pytest.skip("this session does not serve text completions (the runner answers them with a 400)")
        params = self.params(runner_spec, self.short_prompt, max_tokens=3).model_copy(
            update={"raw_prompt": self.short_prompt, "completion": CompletionParams(echo=True, prompt_logprobs=1)}
        )
        chunks = self.collect(loaded.session, "conf-completion", params)
        final = self.assert_well_formed(chunks, "conf-completion")
        echoed = [i for i, c in enumerate(chunks) if isinstance(c, PromptChunk)]
        tokens = [i for i, c in enumerate(chunks) if isinstance(c, TokenChunk) and c.text]
        assert len(echoed) == 1 and (not tokens or echoed[0] < tokens[0]), "one PromptChunk, before any token"
        prompt = chunks[echoed[0]]
        assert isinstance(prompt, PromptChunk) and prompt.text == self.short_prompt
        assert prompt.logprobs and all(lp.logprob <= 0 for lp in prompt.logprobs)
        assert final.finish_reason in ("stop", "length") and len(tokens) <= 3

    # ---------------------------------------------------------------- embeddings

    def test_embed(self, embedding_session: tuple[Any, RunnerSpec]) -> None:
        session, spec = embedding_session
        params = EmbeddingParams(model_id=spec.card.model_id, inputs=self.embed_inputs)
        assert isinstance(session, EmbeddingSession), "an embedding session implements contracts.EmbeddingSession"
        chunk = session.embed("conf-embed", params)
        assert isinstance(chunk, EmbeddingChunk), f"embed returned {type(chunk).__name__}"
        assert chunk.command_id == "conf-embed" and is_terminal(chunk)
        assert len(chunk.embeddings) == len(self.embed_inputs)
        dims = {len(v) for v in chunk.embeddings}
        assert len(dims) == 1 and dims.pop() > 0
        if spec.card.embedding_dimensions:
            assert len(chunk.embeddings[0]) == spec.card.embedding_dimensions
        for vector in chunk.embeddings:
            assert all(math.isfinite(x) for x in vector)
        first, _, again = chunk.embeddings
        assert all(abs(a - b) < 1e-3 for a, b in zip(first, again, strict=True)), "same input, same vector"
        assert codec.decode_union(codec.encode(chunk), _CHUNK) == chunk

    # ---------------------------------------------------------------- reranking

    def test_rerank(self, rerank_session: tuple[Any, RunnerSpec]) -> None:
        """A score per document in the request's order: the same document scores the same wherever it
        stands (a cross-encoder reads each pair alone)."""
        session, spec = rerank_session
        docs = (*self.embed_inputs, "an unrelated sentence about ships")
        params = RerankParams(model_id=spec.card.model_id, query="a fox", documents=docs)
        assert isinstance(session, RerankSession), "a reranking session implements contracts.RerankSession"
        chunk = session.rerank("conf-rerank", params)
        assert isinstance(chunk, ScoreChunk), f"rerank returned {type(chunk).__name__}"
        assert chunk.command_id == "conf-rerank" and is_terminal(chunk)
        assert len(chunk.scores) == len(docs) and all(math.isfinite(x) for x in chunk.scores)
        assert abs(chunk.scores[0] - chunk.scores[2]) < 1e-3, "same document, same score"
        again = session.rerank("conf-rerank-2", params.model_copy(update={"documents": docs[::-1]}))
        assert isinstance(again, ScoreChunk)
        assert all(abs(a - b) < 1e-3 for a, b in zip(again.scores, chunk.scores[::-1], strict=True))
        assert codec.decode_union(codec.encode(chunk), _CHUNK) == chunk


# ============================== planners =========================================================

GiB = 1024**3


class PlannerConformance:
    """A Planner: pure placement over (request, State, node capacities)."""

    backend = "echo-cpu"
    supports_multi_node = True

    @pytest.fixture
    def planner(self) -> Any:
        raise NotImplementedError("subclass PlannerConformance and provide a `planner` fixture")

    @pytest.fixture
    def card(self) -> ModelCard:
        return ModelCard(
            model_id="conformance/model",
            n_layers=8,
            hidden_size=64,
            num_key_value_heads=8,
            context_length=512,
            storage_size=64 * 1024**2,
            compatible_backends=(self.backend,),
        )

    def capacity(self, node_id: str, ram: int = 64 * GiB, backends: tuple[str, ...] | None = None) -> NodeCapacity:
        return NodeCapacity(
            node_id=node_id,
            ram_available=ram,
            ram_total=max(ram, 1),
            backends=backends if backends is not None else (self.backend,),
            splits={b: ("Pipeline", "Tensor") for b in (backends if backends is not None else (self.backend,))},
            addresses=("127.0.0.1",),
        )

    @staticmethod
    def state_with(*nodes: str) -> State:
        """A State where `nodes` joined and all see each other (a fully connected ring)."""
        from skulk_kernel.api import replay

        events: list[Any] = [NodeJoined(node_id=n) for n in nodes]
        events += [TopologyEdgeCreated(edge=Connection(source=a, sink=b)) for a in nodes for b in nodes if a != b]
        return replay(
            IndexedEvent(idx=i, origin=nodes[0] if nodes else "x", at=_EPOCH, event=e) for i, e in enumerate(events)
        )

    def check_instance(
        self, instance: Any, request: PlacementRequest, nodes: dict[str, NodeCapacity], instance_id: str
    ) -> None:
        assert isinstance(instance, RingInstance), f"place() returned {type(instance).__name__}, not an Instance"
        assert instance.instance_id == instance_id
        sa = instance.shard_assignments
        assert sa.model_id == request.model.model_id
        assert set(sa.node_to_runner) <= set(nodes) - set(request.excluded_nodes)
        assert set(sa.runner_to_shard) == set(sa.node_to_runner.values()), "one runner per node"
        shards = sorted(sa.runner_to_shard.values(), key=lambda s: s.device_rank)
        assert [s.device_rank for s in shards] == list(range(len(shards)))
        assert len(shards) >= request.min_nodes
        for shard in shards:
            assert shard.world_size == len(shards) and shard.n_layers == request.model.n_layers
            assert shard.model_id == request.model.model_id
        for node, runner in sa.node_to_runner.items():
            assert sa.runner_to_shard[runner].backend in nodes[node].backends
        if request.sharding == "Pipeline":
            assert shards[0].start_layer == 0 and shards[-1].end_layer == request.model.n_layers
            for prev, nxt in itertools.pairwise(shards):
                assert nxt.start_layer == prev.end_layer, "pipeline shards must tile the layers"
            assert all(s.end_layer > s.start_layer for s in shards)
        assert instance.context_limit >= 1
        # the result is something the master can put into an event and every node can apply
        created = InstanceCreated(instance=instance)
        assert codec.decode(codec.encode(created), InstanceCreated) == created

    def test_declares_the_planner_contract(self, planner: Any) -> None:
        assert isinstance(planner, Planner)
        assert isinstance(planner.name, str) and planner.name

    def test_places_on_one_node(self, planner: Any, card: ModelCard) -> None:
        nodes = {"n1": self.capacity("n1")}
        request = PlacementRequest(model=card)
        instance = planner.place(request, self.state_with("n1"), nodes, "inst-1")
        self.check_instance(instance, request, nodes, "inst-1")
        assert set(instance.shard_assignments.node_to_runner) == {"n1"}

    def test_is_pure(self, planner: Any, card: ModelCard) -> None:
        nodes = {n: self.capacity(n) for n in ("n1", "n2")}
        snapshot = copy.deepcopy(nodes)
        state = self.state_with("n1", "n2")
        request = PlacementRequest(model=card)
        first = planner.place(request, state, nodes, "inst-p")
        assert planner.place(request, state, nodes, "inst-p") == first, "same inputs, same placement"
        assert nodes == snapshot

    def test_no_nodes_is_a_placement_error(self, planner: Any, card: ModelCard) -> None:
        with pytest.raises(PlacementError) as raised:
            planner.place(PlacementRequest(model=card), State(), {}, "inst-0")
        assert raised.value.message and raised.value.kind

    def test_memory_shortfall_is_a_placement_error(self, planner: Any, card: ModelCard) -> None:
        nodes = {"n1": self.capacity("n1", ram=1024)}
        with pytest.raises(PlacementError):
            planner.place(PlacementRequest(model=card), self.state_with("n1"), nodes, "inst-m")

    def test_incompatible_backend_is_a_placement_error(self, planner: Any, card: ModelCard) -> None:
        nodes = {"n1": self.capacity("n1", backends=("nothing-compatible",))}
        with pytest.raises(PlacementError):
            planner.place(PlacementRequest(model=card), self.state_with("n1"), nodes, "inst-b")

    def test_excluded_nodes_are_never_used(self, planner: Any, card: ModelCard) -> None:
        nodes = {n: self.capacity(n) for n in ("n1", "n2")}
        request = PlacementRequest(model=card, excluded_nodes=("n1",))
        instance = planner.place(request, self.state_with("n1", "n2"), nodes, "inst-x")
        self.check_instance(instance, request, nodes, "inst-x")
        assert set(instance.shard_assignments.node_to_runner) == {"n2"}
        with pytest.raises(PlacementError):
            planner.place(
                PlacementRequest(model=card, excluded_nodes=("n1", "n2")), self.state_with("n1", "n2"), nodes, "inst-y"
            )

    def test_min_nodes_beyond_the_cluster_is_a_placement_error(self, planner: Any, card: ModelCard) -> None:
        nodes = {"n1": self.capacity("n1")}
        with pytest.raises(PlacementError):
            planner.place(PlacementRequest(model=card, min_nodes=2), self.state_with("n1"), nodes, "inst-2")

    def test_pipeline_over_two_nodes_tiles_the_layers(self, planner: Any, card: ModelCard) -> None:
        if not self.supports_multi_node:
            pytest.skip("single-node planner")
        nodes = {n: self.capacity(n) for n in ("n1", "n2")}
        request = PlacementRequest(model=card, min_nodes=2)
        instance = planner.place(request, self.state_with("n1", "n2"), nodes, "inst-2n")
        self.check_instance(instance, request, nodes, "inst-2n")
        assert set(instance.shard_assignments.node_to_runner) == {"n1", "n2"}


# ============================== model stores =====================================================


class ModelStoreConformance:
    """A ModelStore: a catalog of cards and where their files are on this node."""

    @pytest.fixture
    def store(self) -> Any:
        raise NotImplementedError("subclass ModelStoreConformance and provide a `store` fixture")

    def test_declares_the_model_store_contract(self, store: Any) -> None:
        assert isinstance(store, ModelStore)
        assert isinstance(store.name, str) and store.name

    def test_catalog_is_keyed_by_model_id(self, store: Any) -> None:
        catalog = store.catalog()
        assert isinstance(catalog, dict)
        for model_id, card in catalog.items():
            assert isinstance(card, ModelCard)
            assert card.model_id == model_id
            assert ModelCard.model_validate(json.loads(json.dumps(card.wire()))) == card

    def test_catalog_is_stable(self, store: Any) -> None:
        assert store.catalog() == store.catalog()

    def test_local_path(self, store: Any) -> None:
        for model_id in store.catalog():
            path = store.local_path(model_id)
            assert path is None or (isinstance(path, Path) and path.exists()), (model_id, path)
        assert store.local_path("conformance/no-such-model-anywhere") is None


# ============================== transports =======================================================


class Inbox:
    """A subscribe() callback that collects (sender, payload) from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.messages: list[tuple[str, bytes]] = []

    def __call__(self, sender: str, payload: bytes) -> None:
        with self._lock:
            self.messages.append((sender, payload))

    def payloads(self) -> list[bytes]:
        with self._lock:
            return [p for _, p in self.messages]

    async def wait_for(self, count: int, timeout: float) -> list[tuple[str, bytes]]:
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if len(self.messages) >= count:
                    return list(self.messages)
            if time.monotonic() > deadline:
                raise TimeoutError(f"got {len(self.messages)} of {count} messages in {timeout}s")
            await asyncio.sleep(0.005)


class TransportConformance:
    """A Transport on one node: own messages come back, in order, per topic; send-to-self works."""

    node_id = "conformance-node"
    settle_s = 0.0  # how long a subscription takes to become live (networked transports)
    delivery_timeout_s = 5.0

    @pytest.fixture
    def transport(self) -> Any:
        raise NotImplementedError(
            "subclass TransportConformance and provide a `transport` fixture returning a fresh, unstarted instance"
        )

    @pytest.fixture
    def transport_options(self, tmp_path: Path) -> dict[str, Any]:
        from skulk_kernel.node import NodeOptions

        return {"plane": "control", "options": NodeOptions(home=tmp_path, node_name="conformance")}

    @pytest.fixture
    async def started(self, transport: Any, transport_options: dict[str, Any]) -> AsyncIterator[Any]:
        await transport.start(self.node_id, transport_options)
        try:
            yield transport
        finally:
            await transport.stop()

    async def subscribe(self, transport: Any, topic: Topic) -> Inbox:
        inbox = Inbox()
        transport.subscribe(topic, inbox)
        if self.settle_s:
            await asyncio.sleep(self.settle_s)
        return inbox

    def test_declares_the_transport_contract(self, transport: Any) -> None:
        assert isinstance(transport, Transport)
        assert isinstance(transport.name, str) and transport.name

    async def test_own_messages_are_delivered(self, started: Any) -> None:
        inbox = await self.subscribe(started, Topic.COMMANDS)
        await started.publish(Topic.COMMANDS, b"hello")
        assert await inbox.wait_for(1, self.delivery_timeout_s) == [(self.node_id, b"hello")]

    async def test_order_is_kept_per_topic(self, started: Any) -> None:
        inbox = await self.subscribe(started, Topic.GLOBAL_EVENTS)
        sent = [f"event-{i}".encode() for i in range(100)]
        for payload in sent:
            await started.publish(Topic.GLOBAL_EVENTS, payload)
        await inbox.wait_for(len(sent), self.delivery_timeout_s)
        assert inbox.payloads() == sent

    async def test_topics_are_separate(self, started: Any) -> None:
        commands = await self.subscribe(started, Topic.COMMANDS)
        events = await self.subscribe(started, Topic.LOCAL_EVENTS)
        await started.publish(Topic.LOCAL_EVENTS, b"event")
        await events.wait_for(1, self.delivery_timeout_s)
        await asyncio.sleep(0.05 + self.settle_s)
        assert commands.payloads() == []

    async def test_every_subscriber_gets_every_message(self, started: Any) -> None:
        first = await self.subscribe(started, Topic.STATE_SYNC)
        second = await self.subscribe(started, Topic.STATE_SYNC)
        await started.publish(Topic.STATE_SYNC, b"x")
        await first.wait_for(1, self.delivery_timeout_s)
        await second.wait_for(1, self.delivery_timeout_s)

    async def test_binary_payloads_arrive_intact(self, started: Any) -> None:
        inbox = await self.subscribe(started, Topic.READINGS)
        payloads = [bytes(range(256)), b"", os.urandom(64 * 1024)]
        for payload in payloads:
            await started.publish(Topic.READINGS, payload)
        await inbox.wait_for(len(payloads), self.delivery_timeout_s)
        assert inbox.payloads() == payloads

    async def test_send_to_self(self, started: Any) -> None:
        inbox = await self.subscribe(started, Topic.CHUNKS)
        await started.send(self.node_id, Topic.CHUNKS, b"chunk-0")
        await started.send(self.node_id, Topic.CHUNKS, b"chunk-1")
        await inbox.wait_for(2, self.delivery_timeout_s)
        assert inbox.messages == [(self.node_id, b"chunk-0"), (self.node_id, b"chunk-1")]

    async def test_on_peer_accepts_a_callback(self, started: Any) -> None:
        started.on_peer(lambda event: None)

    async def test_request_to_self_gets_the_reply(self, started: Any) -> None:
        if not hasattr(started, "request"):
            pytest.skip("this transport has no request/serve")
        senders: list[str] = []

        def answer(sender: str, payload: bytes) -> bytes:
            senders.append(sender)
            return b"re:" + payload

        started.serve(Topic.STATE_SYNC, answer)
        if self.settle_s:
            await asyncio.sleep(self.settle_s)
        reply = await started.request(self.node_id, Topic.STATE_SYNC, b"q", timeout=self.delivery_timeout_s)
        assert reply == b"re:q"
        assert senders == [self.node_id]

    async def test_request_to_nobody_times_out(self, started: Any) -> None:
        if not hasattr(started, "request"):
            pytest.skip("this transport has no request/serve")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(
                started.request("conformance-nobody", Topic.STATE_SYNC, b"q", timeout=0.5), self.delivery_timeout_s + 5
            )


# ============================== elections ========================================================


class ElectionConformance:
    """An Election: a lone node elects itself and stop() returns."""

    election_timeout_s = 15.0

    @pytest.fixture
    def election(self) -> Any:
        raise NotImplementedError("subclass ElectionConformance and provide an `election` fixture")

    @pytest.fixture
    async def lone_node(self, tmp_path: Path) -> AsyncIterator[Any]:
        from .nodes import in_process_node

        async with in_process_node((), home=tmp_path / "node") as node:
            yield node

    def test_declares_the_election_contract(self, election: Any) -> None:
        assert isinstance(election, Election)
        assert isinstance(election.name, str) and election.name

    async def test_a_lone_node_elects_itself(self, election: Any, lone_node: Any) -> None:
        changes: list[str | None] = []

        async def on_change(master: str | None) -> None:
            changes.append(master)

        await election.start(lone_node, on_change)
        try:
            deadline = time.monotonic() + self.election_timeout_s
            while lone_node.node_id not in changes:
                assert time.monotonic() < deadline, f"no self-election in {self.election_timeout_s}s: {changes}"
                await asyncio.sleep(0.02)
            assert all(c is None or isinstance(c, str) for c in changes)
        finally:
            await asyncio.wait_for(election.stop(), 10)


# ============================== API adapters =====================================================


class ApiAdapterConformance:
    """An ApiAdapter: its wire request becomes params; chunks become response bytes."""

    @pytest.fixture
    def adapter(self) -> Any:
        raise NotImplementedError("subclass ApiAdapterConformance and provide an `adapter` fixture")

    @pytest.fixture
    def request_body(self) -> dict[str, Any]:
        raise NotImplementedError("provide `request_body`: a minimal valid request in this wire format")

    @staticmethod
    async def _drain(stream: AsyncIterator[bytes]) -> list[bytes]:
        return [item async for item in stream]

    @staticmethod
    async def _chunks(*chunks: Chunk) -> AsyncIterator[Chunk]:
        for chunk in chunks:
            yield chunk

    def test_declares_the_adapter_contract(self, adapter: Any) -> None:
        assert isinstance(adapter, ApiAdapter)
        assert isinstance(adapter.name, str) and adapter.name

    def test_request_becomes_params(self, adapter: Any, request_body: dict[str, Any]) -> None:
        params = adapter.to_params(copy.deepcopy(request_body))
        assert isinstance(params, TextGenerationParams)
        assert params.messages and params.model_id

    async def test_chunks_become_bytes(self, adapter: Any) -> None:
        stream = adapter.stream(
            self._chunks(
                TokenChunk(command_id="c", seq=0, text="Hello"),
                TokenChunk(command_id="c", seq=1, text=" world"),
                TokenChunk(
                    command_id="c",
                    seq=2,
                    text="",
                    finish_reason="stop",
                    usage=Usage(prompt_tokens=3, completion_tokens=2),
                ),
            )
        )
        out = await asyncio.wait_for(self._drain(stream), 10)
        assert out and all(isinstance(item, bytes) for item in out)
        body = b"".join(out)
        assert b"Hello" in body and b"world" in body

    async def test_an_error_chunk_ends_the_stream(self, adapter: Any) -> None:
        stream = adapter.stream(self._chunks(ErrorChunk(command_id="c", seq=0, message="it broke")))
        out = await asyncio.wait_for(self._drain(stream), 10)
        assert all(isinstance(item, bytes) for item in out)


# ============================== inference middleware =============================================


class InferenceMiddlewareConformance:
    """An InferenceMiddleware: transform returns a command; observe never raises."""

    @pytest.fixture
    def middleware(self) -> Any:
        raise NotImplementedError("subclass and provide a `middleware` fixture")

    @pytest.fixture
    def command(self) -> Any:
        return TextGeneration(
            command_id="conformance-command",
            owner_node_id="conformance-node",
            params=TextGenerationParams(model_id="skulk/echo", messages=(ChatMessage(role="user", content="hello"),)),
        )

    def test_declares_the_middleware_contract(self, middleware: Any) -> None:
        assert isinstance(middleware, InferenceMiddleware)

    def test_transform_returns_a_command(self, middleware: Any, command: Any) -> None:
        out = middleware.transform(command)
        assert _COMMAND.validate_python(out.wire()) == out
        assert out.command_id == command.command_id, "transform must keep the command id"

    def test_observe_accepts_every_chunk(self, middleware: Any, command: Any) -> None:
        for chunk in (
            TokenChunk(command_id=command.command_id, seq=0, text="hi"),
            TokenChunk(command_id=command.command_id, seq=1, text="", finish_reason="stop"),
            ErrorChunk(command_id=command.command_id, seq=2, message="x"),
        ):
            assert middleware.observe(command, chunk) is None
