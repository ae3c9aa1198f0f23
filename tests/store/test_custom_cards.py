"""Custom cards are TOML files in every node's data directory and survive a restart of every node."""

from __future__ import annotations

from pathlib import Path

from skulk_kernel.api import ModelCard
from skulk_store.custom_cards import CustomCardFiles, card_to_toml

from .conftest import Nodes, wait

CARD = {
    "model_id": "acme/tiny-gguf",
    "n_layers": 2,
    "hidden_size": 64,
    "storage_size": 4096,
    "tasks": ["TextGeneration"],
    "source": {
        "kind": "hub",
        "repo_id": "acme/tiny-gguf",
        "revision": "0123456789abcdef0123456789abcdef01234567",
        "main_file": "tiny.gguf",
        "files": {"tiny.gguf": {"size": 4096, "sha256": "ab" * 32}},
    },
}


def test_card_round_trips_through_toml(tmp_path: Path) -> None:
    from skulk_store.cards import card_from_mapping

    card = card_from_mapping(dict(CARD), "test")
    files = CustomCardFiles(tmp_path / "cards")
    files.write(card)
    assert files.load() == {card.model_id: card}
    assert 'revision = "0123456789abcdef' in card_to_toml(card)
    files.delete(card.model_id)
    assert files.load() == {}


def test_custom_card_survives_a_restart_of_every_node(nodes: Nodes) -> None:
    a = nodes.start("a", cluster=True).wait_api()
    b = nodes.start("b", cluster=True).wait_api()

    def members(node) -> int:
        return len(node.state()["topology"]["nodes"])

    wait(lambda: members(a) == 2 and members(b) == 2, 60, "a two-node cluster")
    answer = a.post("/models/add-card", json={"card": CARD})
    assert answer.status_code == 200, answer.text
    for name in ("a", "b"):
        path = nodes.tmp / name / "home" / "cards" / "acme--tiny-gguf.toml"
        wait(path.is_file, 20, f"the card file on {name}")
    a.stop()
    b.stop()

    a2 = nodes.start("a", cluster=True).wait_api()
    b2 = nodes.start("b", cluster=True).wait_api()
    wait(lambda: members(a2) == 2 and members(b2) == 2, 60, "the restarted cluster")
    for node in (a2, b2):
        wait(lambda node=node: "acme/tiny-gguf" in node.state()["customModelCards"], 30, "the restored card")
        card = ModelCard.model_validate(node.state()["customModelCards"]["acme/tiny-gguf"])
        assert card.sections["source"]["revision"] == CARD["source"]["revision"]
        assert any(m["id"] == "acme/tiny-gguf" for m in node.get("/models").json()["data"])

    deleted = a2.get("/models")  # deleting removes the files everywhere
    assert deleted.status_code == 200
    import httpx

    assert httpx.delete(a2.url + "/models/custom/acme/tiny-gguf", timeout=20).status_code == 200
    for name in ("a", "b"):
        path = nodes.tmp / name / "home" / "cards" / "acme--tiny-gguf.toml"
        wait(lambda path=path: not path.exists(), 20, f"the card file gone on {name}")
