"""Issue [suite] acceptance 2: test clusters side by side on one host never join each other.

pytest-xdist runs several workers at once; each gives its nodes a cluster secret of its own
(skulk_testing.isolation). This starts two clusters at once exactly as two workers would: the same
network version (so nothing but the secret tells them apart), multicast discovery on, and checks
that each sees only its own members and that every attempt to join across was refused and counted.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from skulk_testing.isolation import ENV_JOIN_TOKEN, cluster_env

from .conftest import PROFILE, Cluster

pytestmark = pytest.mark.slow


def _ids(cluster: Cluster) -> set[str]:
    return {cluster.node_id(n) for n in cluster.nodes}


def _refused_by(cluster: Cluster) -> set[str]:
    """Node ids this cluster's nodes refused (transport diagnostics, counted per peer)."""
    return {peer for n in cluster.nodes for peer in cluster.diag(n)["transports"]["control"]["refused_peers"]}


def test_two_clusters_on_one_host_stay_apart_and_count_the_refusals(tmp_path: Path) -> None:
    profile = tmp_path / "profile.toml"
    profile.write_text(PROFILE.format(default_models="[]", timeout=30.0, multicast="true", engine="engine-echo"))
    version = f"iso{uuid.uuid4().hex[:10]}"  # shared by both: only the secret separates them
    envs = cluster_env(), cluster_env()
    assert envs[0][ENV_JOIN_TOKEN] != envs[1][ENV_JOIN_TOKEN]
    a, b = (Cluster(tmp_path / name, profile, version, env) for name, env in zip("ab", envs, strict=True))
    try:
        for _ in range(2):  # interleaved, so the two clusters are discovering at the same moment
            a.start()
            b.start()
        a.wait_agreed(60)
        b.wait_agreed(60)
        ids_a, ids_b = _ids(a), _ids(b)
        assert len(ids_a) == len(ids_b) == 2 and not ids_a & ids_b

        a.nodes[0].wait_until(lambda: ids_b <= _refused_by(a), 30, "cluster a to refuse both nodes of b")
        b.nodes[0].wait_until(lambda: ids_a <= _refused_by(b), 30, "cluster b to refuse both nodes of a")
        assert any("REFUSED PEER" in n.log() for n in a.nodes)

        for cluster, own in ((a, ids_a), (b, ids_b)):
            for node in cluster.nodes:
                assert set(node.state()["topology"]["nodes"]) == own
        assert a.wait_agreed(10)[0] in ids_a and b.wait_agreed(10)[0] in ids_b
    finally:
        a.stop()
        b.stop()
