"""Model architectures and accelerators the twin's roofline reads, from the data files that ship with it.

`controlplane/sim/data/models.json` holds each model's published config.json values, `accelerators.json`
each accelerator's datasheet peaks. This module turns them into frozen dataclasses and derives the counts a
step needs: weights read per step (all of a dense model; for a mixture of experts, the experts the step's
tokens touch), FLOPs per token, KV bytes per token, attention FLOPs per query-key pair.

Reads only its own package data (`load_models`, `load_accelerators`); no other I/O. Raises ValueError
naming the file and key when a data file is malformed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, TypeVar

DATA_PACKAGE = "controlplane.sim.data"
T = TypeVar("T")


def read_data_file(name: str) -> dict[str, Any]:
    """The parsed JSON data file `name` of this package. Raises ValueError when it is not a JSON object."""
    text = resources.files(DATA_PACKAGE).joinpath(name).read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{name}: expected a JSON object")
    return data


@dataclass(frozen=True, slots=True)
class ModelArchitecture:
    """A decoder-only transformer as its config.json describes it (dense or mixture of experts)."""

    key: str
    hf_id: str
    source: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    num_experts: int
    num_experts_per_token: int
    moe_intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    bytes_per_param: float
    bytes_per_kv_element: float

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim", "vocab_size",
                     "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ValueError(f"model {self.key}: {name} must be ≥ 1")
        if self.num_experts and not 1 <= self.num_experts_per_token <= self.num_experts:
            raise ValueError(f"model {self.key}: need 1 ≤ num_experts_per_token ≤ num_experts")
        if self.num_experts and self.moe_intermediate_size < 1:
            raise ValueError(f"model {self.key}: a mixture of experts needs moe_intermediate_size ≥ 1")
        if not self.num_experts and self.intermediate_size < 1:
            raise ValueError(f"model {self.key}: a dense model needs intermediate_size ≥ 1")
        if self.bytes_per_param <= 0 or self.bytes_per_kv_element <= 0:
            raise ValueError(f"model {self.key}: bytes per parameter and per KV element must be > 0")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def attention_params_per_layer(self) -> int:
        """q, k, v and o projections of one layer."""
        q_width = self.num_attention_heads * self.head_dim
        kv_width = self.num_kv_heads * self.head_dim
        return 2 * self.hidden_size * q_width + 2 * self.hidden_size * kv_width

    @property
    def expert_params(self) -> int:
        """One expert's gate, up and down projections (0 for a dense model)."""
        return 3 * self.hidden_size * self.moe_intermediate_size if self.is_moe else 0

    @property
    def mlp_params_per_layer(self) -> int:
        """All MLP weights of one layer (every expert and the router for a mixture of experts)."""
        if self.is_moe:
            return self.num_experts * self.expert_params + self.hidden_size * self.num_experts
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def active_mlp_params_per_layer(self) -> int:
        """MLP weights one token multiplies by in one layer (its experts and the router)."""
        if self.is_moe:
            return self.num_experts_per_token * self.expert_params + self.hidden_size * self.num_experts
        return self.mlp_params_per_layer

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        """Parameters held in memory (embedding, layers, the LM head unless tied); norms left out (< 0.01%)."""
        head = 0 if self.tie_word_embeddings else self.lm_head_params
        return self.vocab_size * self.hidden_size + head + self.num_layers * (
            self.attention_params_per_layer + self.mlp_params_per_layer)

    @property
    def weight_bytes(self) -> float:
        """Bytes of weights resident on the accelerator."""
        return self.total_params * self.bytes_per_param

    @property
    def linear_flops_per_token(self) -> float:
        """FLOPs of one token through the layers' linear layers (2 per multiply-add), without the LM head."""
        return 2.0 * self.num_layers * (self.attention_params_per_layer + self.active_mlp_params_per_layer)

    @property
    def lm_head_flops_per_token(self) -> float:
        """FLOPs of the LM head for one sampled token."""
        return 2.0 * self.lm_head_params

    @property
    def attention_flops_per_pair(self) -> float:
        """FLOPs of one causal query-key pair over all layers and query heads (QKᵀ and PV, 2 per multiply-add)."""
        return 4.0 * self.num_layers * self.num_attention_heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> float:
        """KV-cache bytes of one token (keys and values of every layer)."""
        return 2.0 * self.num_layers * self.num_kv_heads * self.head_dim * self.bytes_per_kv_element

    def weight_bytes_read(self, num_tokens: int) -> float:
        """Bytes of weights one forward pass over `num_tokens` tokens streams from memory.

        Dense: every layer weight and the LM head (the embedding is gathered row by row, left out). Mixture of
        experts: the non-expert weights plus, per layer, the expected number of distinct experts the tokens
        route to under uniform routing, E·(1 − (1 − k/E)^T) (one token: k experts; a few dozen: nearly all)."""
        fixed = self.num_layers * (self.attention_params_per_layer
                                   + (self.hidden_size * self.num_experts if self.is_moe else 0))
        fixed += self.lm_head_params
        if not self.is_moe:
            return (fixed + self.num_layers * self.mlp_params_per_layer) * self.bytes_per_param
        tokens = max(1, num_tokens)
        touched = self.num_experts * (1.0 - (1.0 - self.num_experts_per_token / self.num_experts) ** tokens)
        return (fixed + self.num_layers * touched * self.expert_params) * self.bytes_per_param


@dataclass(frozen=True, slots=True)
class Accelerator:
    """Datasheet peaks of one accelerator."""

    key: str
    name: str
    source: str
    peak_bf16_dense_flops: float
    memory_bandwidth_bytes_per_s: float
    memory_bytes: float

    def __post_init__(self) -> None:
        for name in ("peak_bf16_dense_flops", "memory_bandwidth_bytes_per_s", "memory_bytes"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"accelerator {self.key}: {name} must be finite and > 0, got {value}")


def _parse_section(data: dict[str, Any], section: str, file: str, build: Callable[..., T]) -> dict[str, T]:
    """`build(key=key, **entry)` for every entry of the object `data[section]`, by key. Raises ValueError naming
    the file and the entry: the section missing or empty, an entry without a source (all entries are checked
    for that first), or a missing or unknown field."""
    entries = data.get(section)
    if not isinstance(entries, dict) or not entries:
        raise ValueError(f"{file}: expected a non-empty object {section!r}")
    for key, entry in entries.items():
        if not isinstance(entry, dict) or not str(entry.get("source", "")).strip():
            raise ValueError(f"{file}: {section}.{key} must be an object with a non-empty 'source'")
    parsed: dict[str, T] = {}
    for key, entry in entries.items():
        try:
            parsed[key] = build(key=key, **entry)
        except TypeError as exc:
            raise ValueError(f"{file}: {section}.{key}: {exc}") from None
    return parsed


def models_from_json(data: dict[str, Any], *, file: str = "models.json") -> dict[str, ModelArchitecture]:
    """Parse a models.json document. Raises ValueError naming the entry with a missing source or field."""
    return _parse_section(data, "models", file, ModelArchitecture)


def accelerators_from_json(data: dict[str, Any], *, file: str = "accelerators.json") -> dict[str, Accelerator]:
    """Parse an accelerators.json document. Raises ValueError naming the entry with a missing source or field."""
    return _parse_section(data, "accelerators", file, Accelerator)


@cache
def load_models() -> dict[str, ModelArchitecture]:
    """Every model of the package's models.json by key (read once)."""
    return models_from_json(read_data_file("models.json"))


@cache
def load_accelerators() -> dict[str, Accelerator]:
    """Every accelerator of the package's accelerators.json by key (read once)."""
    return accelerators_from_json(read_data_file("accelerators.json"))


def get_model(key: str) -> ModelArchitecture:
    models = load_models()
    if key not in models:
        raise ValueError(f"unknown model {key!r}; known: {', '.join(sorted(models))}")
    return models[key]


def get_accelerator(key: str) -> Accelerator:
    accelerators = load_accelerators()
    if key not in accelerators:
        raise ValueError(f"unknown accelerator {key!r}; known: {', '.join(sorted(accelerators))}")
    return accelerators[key]
