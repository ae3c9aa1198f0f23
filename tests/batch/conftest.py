"""A real 3-node cluster for the Batch API: an API node that is the master (no worker) and two
worker nodes with one SmolLM2 replica each (the [resume] tests' fabric), every node with the batch
plugin."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.conftest import PROFILE, Cluster
from tests.resume.conftest import Fabric

BATCH = """
[plugins.engine-llamacpp]
n_threads = 1
n_threads_batch = 1

[plugins.batch]
segment_lines = 8
segment_s = 1.0
"""


def make_batch_fabric(tmp: Path, models_dir: Path, batch_toml: str = "") -> Fabric:
    """The fabric; `batch_toml`: more `[plugins.batch]` lines (the bench's settings)."""
    tmp.mkdir(parents=True, exist_ok=True)
    profile = tmp / "profile.toml"
    profile.write_text(
        PROFILE.replace('"api-openai"]', '"api-openai", "batch"]').format(
            default_models="[]", timeout=600.0, multicast="true", engine="engine-llamacpp"
        )
        + BATCH
        + batch_toml
    )
    cluster = Cluster(tmp, profile, f"b{uuid.uuid4().hex[:10]}", {"SKULK_MODELS_DIR": str(models_dir)})
    try:
        return Fabric(cluster)
    except BaseException:
        cluster.stop()
        raise


@pytest.fixture(scope="module")
def batch_fabric(tmp_path_factory: pytest.TempPathFactory, models_dir: Path) -> Iterator[Fabric]:
    pytest.importorskip("xllamacpp")
    made = make_batch_fabric(tmp_path_factory.mktemp("batch"), models_dir)
    try:
        yield made
    finally:
        made.cluster.stop()
