"""A tiny random-weight Qwen2 model written to disk by the tests themselves (no downloads)."""

from __future__ import annotations

from pathlib import Path


def write_tiny_model(directory: Path, *, max_position_embeddings: int = 4096, seed: int = 0) -> Path:
    """Write config and bfloat16 random weights of a 2-layer Qwen2 (hidden 256, 4 heads) into directory."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=max_position_embeddings, tie_word_embeddings=True,
        torch_dtype="bfloat16",
    )
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    return directory
