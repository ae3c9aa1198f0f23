"""A tiny random Qwen2-VL written offline for the vision tests (its text is noise; the path is the point).

No registry reachable here ships a vision-language model (FACTS.md), so the test model is built from
a config: a byte-level BPE tokenizer with Qwen2-VL's special tokens and a ChatML template that places
`<|vision_start|><|image_pad|><|vision_end|>` for each image part, Qwen2-VL's image preprocessor
config (images resized to at most 112x112 pixels, patches of 14 merged 2x2), and mlx-vlm's own
`qwen2_vl.Model` with random weights (one vision block, two text layers, 64 wide) saved with
`mlx_vlm.utils.save_weights`, which `mlx_vlm.load` reads back.

Why Qwen2-VL: its processor hands the image processor only image options; with transformers 5
mlx-vlm's LLaVA processor passes text options (`padding`) to an image processor that refuses them.
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n'}}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    "{{ '<|vision_start|><|image_pad|><|vision_end|>' }}{% else %}{{ part['text'] }}{% endif %}{% endfor %}"
    "{% endif %}{{'<|im_end|>\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def write_tiny_vlm(folder: Path, seed: int = 0) -> Path:
    """Write the model folder (about 0.5 MB) and return it."""
    import mlx.core as mx
    from mlx_vlm.models import qwen2_vl
    from mlx_vlm.utils import save_weights
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(["hello world the quick brown fox", "what is in the picture"] * 20, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    fast.chat_template = TEMPLATE
    fast.save_pretrained(str(folder))
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    preprocessor = {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2VLProcessor",
        "min_pixels": 56 * 56,
        "max_pixels": 112 * 112,
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "do_resize": True,
        "do_rescale": True,
        "do_normalize": True,
        "do_convert_rgb": True,
    }
    (folder / "preprocessor_config.json").write_text(json.dumps(preprocessor))
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    config = {
        "model_type": "qwen2_vl",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6,
        "vocab_size": tok.get_vocab_size(),
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
        "tie_word_embeddings": False,
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "eos_token_id": [ids["<|im_end|>"]],
        "vision_config": {
            "model_type": "qwen2_vl",
            "depth": 1,
            "embed_dim": 32,
            "hidden_size": 64,
            "num_heads": 2,
            "patch_size": 14,
            "spatial_patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "mlp_ratio": 2,
            "in_channels": 3,
        },
    }
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    model_config = qwen2_vl.ModelConfig.from_dict(dict(config))
    model_config.text_config = qwen2_vl.TextConfig.from_dict(config)
    model_config.vision_config = qwen2_vl.VisionConfig.from_dict(config["vision_config"])
    mx.random.seed(seed)
    save_weights(folder, qwen2_vl.Model(model_config))
    return folder
