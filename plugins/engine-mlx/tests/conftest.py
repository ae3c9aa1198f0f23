"""Fixtures: a tiny random model (fast tests) and the real SmolLM2 / Qwen 0.5B folders (slow tests).

Real models are provisioned once per machine into $SKULK_TEST_MODELS_DIR/mlx (default
<tmp>/skulk-test-models/mlx) through the same provisioners the store runs; the first run pays the
conversion venv (torch + transformers, a few minutes) and the conversion (about a minute).
Anything that cannot be provisioned skips instead of failing.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:  # the helpers next to the tests (tiny_model.py)
    sys.path.insert(0, str(_HERE))

from skulk_kernel.api import ModelCard  # noqa: E402

SMOLLM2_CARD = ModelCard(
    model_id="HuggingFaceTB/SmolLM2-135M-Instruct-MLX",
    n_layers=30,
    hidden_size=576,
    num_key_value_heads=3,
    supports_tensor=True,
    context_length=8192,
    compatible_backends=("mlx-cpu", "mlx-metal"),
)


@pytest.fixture(scope="session")
def mlx_models_dir() -> Path:
    root = os.environ.get("SKULK_TEST_MODELS_DIR") or Path(tempfile.gettempdir()) / "skulk-test-models"
    return Path(root) / "mlx"


def _provisioned(folder: Path, provision: Callable[..., Path], cache: Path) -> Path:
    from skulk_engine_mlx.models import ProvisionError

    if (folder / ".complete").is_file():
        return folder / "config.json"
    staging = folder.with_name(folder.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        provision(staging, None, cache_dir=cache)
    except ProvisionError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        pytest.skip(f"{folder.name} not provisionable here: {exc}")
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
    (folder / ".complete").write_text("ok\n")
    return folder / "config.json"


@pytest.fixture(scope="session")
def smollm2_mlx(mlx_models_dir: Path) -> Path:
    from skulk_engine_mlx.models import provision_smollm2_mlx

    return _provisioned(mlx_models_dir / "smollm2", provision_smollm2_mlx, mlx_models_dir.parent / ".cache" / "wheels")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_model import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("tiny-mlx"))


@pytest.fixture(scope="session")
def tiny_card() -> ModelCard:
    from tiny_model import N_LAYERS

    return ModelCard(
        model_id="test/tiny-mlx",
        n_layers=N_LAYERS,
        hidden_size=128,
        num_key_value_heads=2,
        context_length=160,
        compatible_backends=("mlx-cpu", "mlx-metal"),
    )
