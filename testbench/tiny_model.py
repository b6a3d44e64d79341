"""A tiny random-weight Qwen2 model written to disk by the e2e tests and the engine benchmarks themselves (no
downloads)."""

from __future__ import annotations

from pathlib import Path


def write_tiny_model(directory: Path, *, max_position_embeddings: int = 4096, seed: int = 0,
                     initializer_range: float = 0.02) -> Path:
    """Write config and bfloat16 random weights of a 2-layer Qwen2 (hidden 256, 4 heads) into directory.

    With the default `initializer_range` greedy decoding mostly repeats one token (what n-gram speculation
    needs to propose drafts); 0.2 gives varied outputs (a sharper check that two runs generate the same).
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=max_position_embeddings, tie_word_embeddings=True,
        torch_dtype="bfloat16", initializer_range=initializer_range,
    )
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    return directory


def write_tiny_tokenizer(directory: Path, *, vocab_size: int = 1024) -> Path:
    """Write a character-level fast tokenizer (no download) for the tiny model into directory.

    Token ids 0 and 1 are <unk> and <eos>, then the printable ASCII characters (one token each, so any
    string a grammar allows can be spelled), then filler words up to `vocab_size`. Keep the directory free of
    a model config.json: transformers would otherwise map the tokenizer to the model's own class.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<eos>": 1}
    for code in range(32, 127):
        vocab[chr(code)] = len(vocab)
    filler = 0
    while len(vocab) < vocab_size:
        vocab[f"w{filler}"] = len(vocab)
        filler += 1
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tokenizer.decoder = decoders.Fuse()
    directory.mkdir(parents=True, exist_ok=True)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", eos_token="<eos>").save_pretrained(directory)
    return directory
