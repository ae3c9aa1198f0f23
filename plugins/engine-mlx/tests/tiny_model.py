"""A tiny random llama written offline for fast tests (never for acceptance: its text is noise).

A byte-level BPE tokenizer trained on a few sentences (``tokenizers``), wrapped as a
PreTrainedTokenizerFast with a ChatML template, and a random 4-layer mlx-lm llama with untied
embeddings saved with ``mlx_lm.utils.save_model``. Output weights of tokens that are not plain
printable ASCII are zeroed, so greedy text is readable and never broken UTF-8.
"""

from __future__ import annotations

import json
from pathlib import Path

CHATML = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, this is a tiny model for tests",
    "count one two three four five six seven eight nine ten",
    "paris is the capital of france and rome is the capital of italy",
] * 20
N_LAYERS = 4


def write_tiny_model(folder: Path, seed: int = 0) -> Path:
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.models import llama
    from mlx_lm.utils import save_config, save_model
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    fast.chat_template = CHATML
    fast.save_pretrained(str(folder))
    vocab = tok.get_vocab_size()

    config = {
        "model_type": "llama",
        "hidden_size": 128,
        "num_hidden_layers": N_LAYERS,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": vocab,
        "tie_word_embeddings": False,
        "rope_theta": 10000.0,
        "max_position_embeddings": 2048,
        "eos_token_id": tok.token_to_id("<|im_end|>"),
    }
    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    params = dict(tree_flatten(model.parameters()))
    head = np.array(params["lm_head.weight"].astype(mx.float32))
    for token_id in range(vocab):
        text = tok.decode([token_id])
        if not (text and text.isascii() and text.isprintable()):
            head[token_id] = 0.0
    params["lm_head.weight"] = mx.array(head * 4.0)
    model.update(tree_unflatten(list(params.items())))
    save_model(folder, model)
    save_config(config, folder / "config.json")
    (folder / "tiny.json").write_text(json.dumps({"seed": seed}))
    return folder / "config.json"
