"""A tiny Stable Diffusion pipeline with random weights, written as a real diffusers folder.

No diffusion weights can be had offline here, so tests and benchmarks build one: a two-level
UNet, a two-level VAE, a two-layer CLIP text encoder and a character-level CLIP tokenizer (a
`vocab.json` and an empty `merges.txt`), with a DDIM scheduler, saved by `save_pretrained` and
loaded back by the engine with `from_pretrained` exactly as a real model folder would be. The
weights come from a fixed torch seed, so two builds make the same folder and the same images.
It renders nonsense (random weights), but every part of the real path runs: tokenizer, text
encoder, denoising loop with classifier-free guidance, VAE decode, image-to-image for edits.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

NATIVE = 64  # pixels; latents are 32x32


def _write_tokenizer(folder: Path) -> int:
    """A character-level CLIP BPE vocabulary (every printable character, alone and word-final)."""
    folder.mkdir(parents=True, exist_ok=True)
    chars = sorted(set(string.ascii_lowercase + string.digits + string.punctuation))
    vocab: dict[str, int] = {}
    for char in chars:
        vocab[char] = len(vocab)
    for char in chars:
        vocab[char + "</w>"] = len(vocab)
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    return len(vocab)


def build_tiny_pipeline(folder: Path, seed: int = 0) -> Path:
    """Write the pipeline into `folder` (created) and return it; needs torch and diffusers importable."""
    import tempfile

    import torch
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory() as scratch:
        vocab_size = _write_tokenizer(Path(scratch))
        tokenizer = CLIPTokenizer(
            vocab_file=str(Path(scratch) / "vocab.json"),
            merges_file=str(Path(scratch) / "merges.txt"),
            model_max_length=32,
        )
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=vocab_size,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=32,
            bos_token_id=vocab_size - 2,
            eos_token_id=vocab_size - 1,
            pad_token_id=vocab_size - 1,
        )
    )
    unet = UNet2DConditionModel(
        sample_size=NATIVE // 2,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(32, 64),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
    )
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(32, 64),
        latent_channels=4,
        sample_size=NATIVE,
    )
    scheduler = DDIMScheduler(clip_sample=False, set_alpha_to_one=False, beta_schedule="scaled_linear")
    pipe = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    folder.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(str(folder))
    return folder
