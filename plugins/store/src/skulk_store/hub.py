"""The model hub, through `huggingface_hub` (the real client), pinned to commits.

`HF_ENDPOINT` picks the hub (tests point it at a loopback server that speaks the same protocol) and
`HF_TOKEN` authenticates; the library reads both from the environment, and nothing here stores,
logs or returns the token. Every download names a full commit id, never a branch, so a card always
means the same bytes. An interrupted file stays as `.partial/<name>.<etag>.part` in the download
folder and the next run continues it with a range request (`http_get(resume_size=...)`).
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict
from skulk_kernel.api import ModelCard

from .cards import CardError, card_from_config_json, card_from_gguf_metadata

log = logging.getLogger("skulk.store.hub")

COMMIT = re.compile(r"^[0-9a-f]{40}$")
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
#: quantizations tried in order when a GGUF repository has several files and none was named
GGUF_PREFERENCE = ("Q4_K_M", "Q4_1", "Q4_0", "Q5_K_M", "Q8_0", "F16")
#: the files of a safetensors repository that an engine reads
FOLDER_FILES = re.compile(r"(\.safetensors|\.json|\.model|\.txt|\.jinja|\.tiktoken)$")


class HubError(ValueError):
    """The hub refused or lacks what was asked; the message says what to fix."""


class HubFile(BaseModel):
    model_config = ConfigDict(frozen=True)
    name: str
    size: int
    sha256: str = ""  # LFS files carry one; small git files do not


class HubModel(BaseModel):
    """A repository resolved to one commit and the files Skulk will fetch from it."""

    model_config = ConfigDict(frozen=True)
    repo_id: str
    commit: str
    files: tuple[HubFile, ...]
    main_file: str  # the GGUF file, or "" for a folder

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


_configured_endpoint: str | None = None  # the cluster's `hub_endpoint` setting (PUT /config), when set


def set_configured_endpoint(url: str | None) -> None:
    """The cluster setting `hub_endpoint` (plugin.py keeps it current from State): it wins over
    `HF_ENDPOINT`, so an operator can point every node's next download at a mirror at once."""
    global _configured_endpoint
    _configured_endpoint = url or None


_configured_token: str | None = None  # the cluster's sealed `hub_token` setting, unsealed by this node


def set_configured_token(token: str | None) -> None:
    """The cluster setting `hub_token` (sealed in State with the cluster secret; plugin.py unseals it):
    sent to the hub instead of `HF_TOKEN` while set. Never logged."""
    global _configured_token
    _configured_token = token or None


def _token() -> str | None:
    return _configured_token  # None: huggingface_hub's own (HF_TOKEN, the stored login)


def endpoint() -> str:
    return (_configured_endpoint or os.environ.get("HF_ENDPOINT", "https://huggingface.co")).rstrip("/")


def _api() -> Any:
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint(), token=_token())


def _hub_error(exc: Exception, what: str) -> HubError:
    name = type(exc).__name__
    if name == "RepositoryNotFoundError":
        return HubError(f"{what}: no such repository on {endpoint()} (or it is private and HF_TOKEN lacks access)")
    if name == "RevisionNotFoundError":
        return HubError(f"{what}: no such revision (use a branch, a tag or a full 40-character commit id)")
    if name == "EntryNotFoundError":
        return HubError(f"{what}: no such file in the repository")
    return HubError(f"{what}: the hub at {endpoint()} answered {name}: {exc}")


def is_projector(name: str) -> bool:
    return name.split("/")[-1].lower().startswith("mmproj") and name.endswith(".gguf")


def _projector(names: dict[str, Any]) -> list[Any]:
    """A vision repository's projector (`mmproj*.gguf`), fetched with the model (F16 first, else the
    smallest): llama.cpp reads images through it (engine-llamacpp's vision.py)."""
    found = sorted(n for n in names if is_projector(n))
    if not found:
        return []
    return [names[next((n for n in found if "f16" in n.lower()), min(found, key=lambda n: names[n].size or 0))]]


def pick_files(siblings: list[Any], wanted: str | None) -> tuple[list[Any], str]:
    """(files to fetch, main file) for a repository's file list; `wanted` names one GGUF file. A
    repository with a projector (`mmproj*.gguf`) gets it fetched beside the model GGUF."""
    names = {s.rfilename: s for s in siblings}
    ggufs = sorted(n for n in names if n.endswith(".gguf") and not is_projector(n))
    if wanted:
        if wanted not in names:
            raise HubError(f"file {wanted!r} is not in the repository (it has {sorted(names)[:20]})")
        return [names[wanted], *(_projector(names) if wanted.endswith(".gguf") else [])], (
            wanted if wanted.endswith(".gguf") else ""
        )
    if ggufs:
        whole = [n for n in ggufs if not re.search(r"-\d{5}-of-\d{5}\.gguf$", n)] or ggufs
        for quant in GGUF_PREFERENCE:
            hit = next((n for n in whole if quant.lower() in n.lower()), None)
            if hit:
                return [names[hit], *_projector(names)], hit
        smallest = min(whole, key=lambda n: names[n].size or 0)
        return [names[smallest], *_projector(names)], smallest
    folder = [s for n, s in names.items() if FOLDER_FILES.search(n) and "/" not in n]
    if not any(s.rfilename == "config.json" for s in folder):
        raise HubError("the repository has neither a .gguf file nor a config.json: Skulk cannot serve it")
    return folder, ""


def resolve(repo_id: str, revision: str | None = None, file: str | None = None) -> HubModel:
    """Pin `revision` (default `main`) to its commit and choose the files (sizes, SHA-256)."""
    if not REPO_ID.match(repo_id):
        raise HubError(f"{repo_id!r} is not a repository id (owner/name)")
    try:
        info = _api().model_info(repo_id, revision=revision or "main", files_metadata=True)
    except Exception as exc:
        raise _hub_error(exc, repo_id) from None
    if not info.sha or not COMMIT.match(info.sha):
        raise HubError(f"{repo_id}: the hub gave no commit id for {revision or 'main'}")
    chosen, main = pick_files(list(info.siblings or []), file)
    files = tuple(
        HubFile(name=s.rfilename, size=int(s.size or 0), sha256=(s.lfs.sha256 if s.lfs else "")) for s in chosen
    )
    return HubModel(repo_id=repo_id, commit=info.sha, files=files, main_file=main)


def search(query: str, limit: int = 20) -> list[dict[str, Any]]:
    try:
        found = list(_api().list_models(search=query, limit=limit))
    except Exception as exc:
        raise _hub_error(exc, f"search {query!r}") from None
    return [{"id": m.id, "downloads": getattr(m, "downloads", None) or 0} for m in found]


def _ranged_prefix(model: HubModel, name: str, size: int) -> bytes:
    """The first `size` bytes of a file, by a range request through the library's own session."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    url = hf_hub_url(model.repo_id, name, revision=model.commit, endpoint=endpoint())
    headers = {**build_hf_headers(token=_token()), "Range": f"bytes=0-{size - 1}"}
    response = get_session().get(url, headers=headers, follow_redirects=True, timeout=60)
    hf_raise_for_status(response)
    return bytes(response.content[:size])


def card_for(model: HubModel, model_id: str) -> ModelCard:
    """A card built from the repository's own metadata, without downloading the weights.

    GGUF: the header's key/value section is read by a range request (growing until it fits).
    Folder: `config.json` alone is downloaded.
    """
    if model.main_file:
        from .gguf_header import NotGGUF, Truncated, read_metadata

        size = next(f.size for f in model.files if f.name == model.main_file)
        want = 4 << 20
        while True:
            head = _ranged_prefix(model, model.main_file, min(want, size))
            try:
                meta = read_metadata(head)
                break
            except Truncated:
                if len(head) >= size or want >= 256 << 20:
                    raise HubError(f"{model.repo_id}/{model.main_file}: the GGUF header is cut short") from None
                want *= 4
            except NotGGUF as exc:
                raise HubError(f"{model.repo_id}/{model.main_file}: {exc}") from None
        try:
            card = card_from_gguf_metadata(meta, model_id, size, Path(model.main_file).name)
        except CardError as exc:
            raise HubError(str(exc)) from None
        projector = next((f.name for f in model.files if is_projector(f.name)), None)
        if projector is not None:  # a vision model: the projector is staged and copied with it
            sections = {**card.sections, "vision": {"mmproj": projector}}
            card = card.model_copy(update={"capabilities": (*card.capabilities, "vision"), "sections": sections})
    else:
        from huggingface_hub import hf_hub_download

        with tempfile.TemporaryDirectory(prefix="skulk-card-") as tmp:
            try:
                hf_hub_download(model.repo_id, "config.json", revision=model.commit, local_dir=tmp, endpoint=endpoint())
                card = card_from_config_json(Path(tmp), model_id)
            except Exception as exc:
                raise _hub_error(exc, f"{model.repo_id}/config.json") from None
    source = {
        "kind": "hub",
        "repo_id": model.repo_id,
        "revision": model.commit,
        "main_file": model.main_file,
        "files": {f.name: {"size": f.size, "sha256": f.sha256} for f in model.files},
    }
    return card.model_copy(update={"storage_size": model.total_bytes, "sections": {**card.sections, "source": source}})


def model_from_source(source: dict[str, Any]) -> HubModel:
    files = tuple(
        HubFile(name=name, size=int(meta.get("size", 0)), sha256=str(meta.get("sha256", "")))
        for name, meta in dict(source.get("files", {})).items()
    )
    return HubModel(
        repo_id=str(source["repo_id"]),
        commit=str(source["revision"]),
        files=files,
        main_file=str(source.get("main_file", "")),
    )


PARTIAL = ".partial"


def partial_path(folder: Path, name: str, etag: str) -> Path:
    """Where the bytes of `name` collect until it is whole; keyed by etag, so a changed file
    never continues another's bytes."""
    return folder / PARTIAL / f"{name.replace('/', '--')}.{etag[:64]}.part"


class Interrupted(RuntimeError):
    """`should_stop` said stop while the body was streaming; the bytes so far stay on disk."""


class _StoppableFile:
    """The file `http_get` writes into, which stops the transfer between blocks when asked.

    `http_get` has no cancel hook; raising from `write` ends its loop at once (it retries only
    network errors), so a cancel takes effect within one block (`DOWNLOAD_CHUNK_SIZE`, 10 MB)
    instead of after the file's last byte.
    """

    def __init__(self, f: Any, should_stop: Callable[[], bool]) -> None:
        self._f = f
        self._should_stop = should_stop

    def write(self, block: bytes) -> int:
        written = int(self._f.write(block))  # kept: a resume starts after it
        if self._should_stop():
            raise Interrupted("stopped by request")
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


def download_file(model: HubModel, name: str, folder: Path, should_stop: Callable[[], bool] = lambda: False) -> Path:
    """One file into `folder` at the pinned commit, resuming what an earlier (killed) run left.

    The library's `get_hf_file_metadata` does the HEAD (etag, size, the commit the revision
    resolves to, the redirect) and its `http_get` streams the body with a `Range` from the bytes
    already on disk. (`hf_hub_download` itself writes to a process-unique temporary file, so it
    cannot continue a download a killed process left behind.)
    """
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    target = folder / name
    expected = next((f for f in model.files if f.name == name), None)
    if target.is_file() and (expected is None or not expected.size or target.stat().st_size == expected.size):
        return target
    what = f"{model.repo_id}/{name}@{model.commit[:12]}"
    url = hf_hub_url(model.repo_id, name, revision=model.commit, endpoint=endpoint())
    try:
        meta = get_hf_file_metadata(url, token=_token(), endpoint=endpoint(), retry_on_errors=True)
    except Exception as exc:
        raise _hub_error(exc, what) from None
    if meta.commit_hash and meta.commit_hash != model.commit:
        raise HubError(f"{what}: the hub resolved the pinned commit to {meta.commit_hash}")
    etag = meta.etag or (expected.sha256 if expected else "") or "noetag"
    part = partial_path(folder, name, etag)
    part.parent.mkdir(parents=True, exist_ok=True)
    resume = part.stat().st_size if part.exists() else 0
    if meta.size is not None and resume > meta.size:
        part.unlink()
        resume = 0
    try:
        with open(part, "r+b" if resume else "wb") as f:
            f.seek(resume)
            body = _StoppableFile(f, should_stop)
            headers = build_hf_headers(token=_token())
            http_get(meta.location, body, resume_size=resume, headers=headers, expected_size=meta.size)  # type: ignore[arg-type]
    except Interrupted:
        raise
    except Exception as exc:
        raise _hub_error(exc, what) from None
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(part, target)
    return target


def bytes_on_disk(folder: Path, file: HubFile) -> int:
    """How much of `file` is in `folder`, counting its partial file."""
    done = folder / file.name
    if done.is_file():
        return done.stat().st_size
    parts = folder / PARTIAL
    if not parts.is_dir():
        return 0
    prefix = file.name.replace("/", "--") + "." + file.sha256
    return max((p.stat().st_size for p in parts.iterdir() if p.name.startswith(prefix)), default=0)
