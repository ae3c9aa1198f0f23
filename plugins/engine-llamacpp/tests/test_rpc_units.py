"""Units of the llama_rpc engine around the real processes (those are tested in tests/split/)."""

from __future__ import annotations

from pathlib import Path

from skulk_engine_llamacpp.rpc_build import RpcBuild, find_build
from skulk_engine_llamacpp.rpc_engine import RpcLlamaServer, tensor_split
from skulk_kernel.api import ModelCard
from skulk_store.cards import GGUF_BACKENDS, with_current_backends


def test_a_cpu_driver_keeps_rank_0s_layers_and_offloads_the_rest_in_rank_order():
    assert tensor_split([(0, 10), (10, 20), (20, 30)]) == (20, [10, 10])


def test_a_gpu_driver_puts_every_layer_on_devices_its_own_gpu_first():
    assert tensor_split([(0, 14), (14, 24)], local_gpu=True) == (25, [14, 10])


def test_the_driver_runs_with_the_settings_that_keep_a_split_exact(tmp_path: Path):
    build = RpcBuild(str(tmp_path), "llama-cpp-python 0.3.36", "0c1e570", "7.0.0", "cpu", (), "ab" * 32)
    server = RpcLlamaServer(build, ["127.0.0.1:1", "127.0.0.1:2"], 20, [10, 10], model_path=tmp_path / "m.gguf")
    cmd = server.command(8080)
    assert cmd[cmd.index("--rpc") + 1] == "127.0.0.1:1,127.0.0.1:2" and cmd[cmd.index("-ts") + 1] == "10,10"
    assert "--no-repack" in cmd and cmd[cmd.index("--load-mode") + 1] == "none" and "--fit" in cmd
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"  # the driver's HTTP API never leaves the host


def test_a_missing_or_half_written_build_is_no_build(tmp_path: Path):
    assert find_build(tmp_path) is None
    (tmp_path / "build.json").write_text("{not json")
    assert find_build(tmp_path) is None


def test_a_gguf_card_installed_before_llama_rpc_gets_todays_backends():
    old = ModelCard(
        model_id="m",
        n_layers=2,
        hidden_size=8,
        num_key_value_heads=1,
        storage_size=1,
        compatible_backends=("llama_server-cpu", "llama_cpp-cpu"),
        backend_preference=("llama_server-cpu", "llama_cpp-cpu"),
    )
    assert set(with_current_backends(old).compatible_backends) == set(GGUF_BACKENDS)
    embedding = old.model_copy(update={"tasks": ("TextEmbedding",), "compatible_backends": ("llama_server-cpu",)})
    assert all(b.startswith("llama_server-") for b in with_current_backends(embedding).compatible_backends)


def test_a_rank_that_never_answers_fails_the_driver_within_its_deadline():
    import time

    import pytest
    from skulk_engine_llamacpp.rpc_engine import free_loopback_port
    from skulk_engine_llamacpp.rpc_tunnel import MemberTls, TunnelError, Tunnels

    tunnels = Tunnels(MemberTls.of_this_node())
    try:
        started = time.monotonic()
        with pytest.raises(TunnelError, match=r"did not answer within 1 s"):
            tunnels.wait_reachable(f"127.0.0.1:{free_loopback_port()}", 1.0)
        assert time.monotonic() - started < 3
    finally:
        tunnels.close()
