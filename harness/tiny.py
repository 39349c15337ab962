"""A tiny config for every model type, from the config class's defaults alone (no hub, no test files).

Every size is shrunk by the rules in ``_RULES`` (matched on the attribute name), recursing into sub-configs, with
one width, one feed-forward size and one head count everywhere, so sizes that must agree across sub-configs
(a projector's input and a vision tower's output) agree by construction. Then the invariants models assert are
restored (heads divide widths, kv heads divide heads, token ids inside the vocabulary, per-layer lists as long as
the layer count), and the per-model-type rows of ``TINY_OVERRIDES`` are applied last.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from .tables import TINY_OVERRIDES

WIDTH = 32  # every hidden size, embedding size, projection size
FFN = 64  # every feed-forward size
HEADS = 4
KV_HEADS = 2
HEAD_DIM = WIDTH // HEADS
LAYERS = 2
VOCAB = 128  # ids >= SPECIAL_FLOOR are kept for special tokens; inputs draw from below it
SPECIAL_FLOOR = 100
POSITIONS = 128
IMAGE = 32
PATCH = 8
EXPERTS = 4
EXPERTS_PER_TOKEN = 2
WINDOW = 4

_TOKEN_ID = re.compile(r"(^|_)(token_id|token_index|token_ids|start_token_id|id)$|_token_(id|index)$")


def _cap(value, limit):
    return min(value, limit) if isinstance(value, int) and not isinstance(value, bool) else value


def _scaled_list(values, top):
    """A per-stage list of widths, scaled so its largest is ``top``, each a positive multiple of 8."""
    largest = max(values)
    if largest <= top:
        return type(values)(values)
    return type(values)(max(8, int(round(v * top / largest / 8)) * 8) for v in values)


def _int_list(value) -> bool:
    return isinstance(value, (list, tuple)) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


# (attribute-name pattern, rule(value) -> new value). The first matching pattern whose rule applies wins.
_RULES: list[tuple[re.Pattern, Any]] = [
    (r"^(num_feat_extract_layers|num_conv_pos_embedding_groups|num_conv_pos_embeddings)$", None),  # tied to lists
    (r"^(first_k_dense_replace|num_dense_layers|insert_layer_id|max_window_layers)$", lambda v: _cap(v, 1)),
    (r"^(num_hidden_layers|num_layers|n_layers?|encoder_layers|decoder_layers|num_encoder_layers"
     r"|num_decoder_layers|depth|num_blocks|\w+_layers|\w+_depth|num_hidden_blocks)$", lambda v: _cap(v, LAYERS)),
    (r"^(num_key_value_heads|num_kv_heads|n_kv_heads|multi_query_group_num|\w+_kv_heads)$", lambda v: _cap(v, KV_HEADS)),
    (r"^(num_attention_heads|n_heads?|num_heads|encoder_attention_heads|decoder_attention_heads|attention_heads"
     r"|\w+_attention_heads|\w+_num_heads|num_\w+_heads)$",
     lambda v: _cap(v, HEADS) if isinstance(v, int) else type(v)(min(h, 2) for h in v) if _int_list(v) else v),
    (r"^(qk_rope_head_dim|qk_nope_head_dim|v_head_dim|head_dim|d_kv|kv_channels|dim_head|attention_head_dim"
     r"|\w+_head_dim|head_size)$", lambda v: _cap(v, HEAD_DIM)),
    (r"^(kv_lora_rank|q_lora_rank|\w+_lora_rank)$", lambda v: _cap(v, 16)),
    (r"^(num_experts|num_local_experts|n_routed_experts|moe_num_experts|num_experts_per_layer|n_experts)$",
     lambda v: _cap(v, EXPERTS)),
    (r"^(num_experts_per_tok|moe_topk|top_k|num_selected_experts|moe_k|router_topk|num_experts_per_token)$",
     lambda v: _cap(v, EXPERTS_PER_TOKEN)),
    (r"^(n_shared_experts|num_shared_experts|moe_num_shared_experts)$", lambda v: _cap(v, 1)),
    (r"^(n_group|topk_group)$", lambda v: _cap(v, 1)),
    (r"(^|_)vocab_size$", lambda v: _cap(v, VOCAB) if isinstance(v, int) and v > 16 else v),
    (r"^(max_position_embeddings|n_positions|max_source_positions|max_target_positions|max_seq_len"
     r"|max_sequence_length|n_ctx|max_length|\w+_max_position_embeddings)$", lambda v: _cap(v, POSITIONS)),
    (r"^(sliding_window|window_size|attention_window)$", lambda v: _cap(v, WINDOW) if isinstance(v, int) and v > 64 else v),
    (r"(intermediate_size|ffn_dim|^d_ff$|^n_inner$|mlp_dim|intermediate_dim|ffn_hidden_size|^dim_feedforward$)",
     lambda v: _cap(v, FFN)),
    (r"^(image_size|img_size|input_size)$",
     lambda v: _cap(v, IMAGE) if isinstance(v, int) and v >= 64 else type(v)(IMAGE for _ in v)
     if _int_list(v) and min(v) >= 64 else v),
    (r"^patch_size$", lambda v: _cap(v, PATCH) if isinstance(v, int) else v),
    (r"^(conv_dim|tdnn_dim)$", lambda v: type(v)(min(c, WIDTH) for c in v) if _int_list(v) else v),
    (r"^(hidden_sizes|embed_dims|dims|neck_hidden_sizes|embedding_dims|channels|widths|block_widths"
     r"|encoder_hidden_sizes|decoder_hidden_sizes)$", lambda v: _scaled_list(v, WIDTH) if _int_list(v) else v),
    (r"^(depths|layers_per_stage|num_layers_per_stage|stage_depths)$",
     lambda v: type(v)(min(d, 1) for d in v) if _int_list(v) else v),
    (r"(hidden_size|d_model|n_embd|embed_dim|hidden_dim|embedding_size|embedding_dim|projection_dim|proj_dim"
     r"|projection_size|proj_size|projector_dim"
     r"|d_embed|model_dim|_width$|^width$|^dim$|output_dim|out_channels|num_filters|latent_dim|codebook_dim)",
     lambda v: _cap(v, WIDTH)),
]
_RULES = [(re.compile(pattern), rule) for pattern, rule in _RULES]


def _shrink_value(name: str, value):
    for pattern, rule in _RULES:
        if pattern.search(name):
            return value if rule is None else rule(value)
    return value


def _is_config(value) -> bool:
    from transformers import PreTrainedConfig

    return isinstance(value, PreTrainedConfig)


def _init_fields(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.init]


def _layers_of(values: dict) -> int | None:
    for key in ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "decoder_layers"):
        if isinstance(values.get(key), int):
            return values[key]
    return None


def _fit_per_layer_list(values: list, layers: int):
    """A list with one entry per layer, cut to ``layers`` entries, keeping each distinct kind where it can."""
    kinds = list(dict.fromkeys(values))
    if len(kinds) <= layers:
        chosen = kinds + [values[-1]] * (layers - len(kinds))
        # keep the original order of first appearance, repeating the last kind
        return chosen
    return values[:layers]


def shrink(config) -> dict:
    """The keyword arguments that build a tiny version of ``config`` (its class' fields only)."""
    fields = _init_fields(type(config))
    original_layers = _layers_of({name: getattr(config, name, None) for name in fields})
    values: dict[str, Any] = {}
    for name in fields:
        value = getattr(config, name, None)
        if _is_config(value):
            values[name] = tiny_from(value)
        elif isinstance(value, dict) and isinstance(value.get("model_type"), str):
            from transformers import AutoConfig

            values[name] = tiny_from(AutoConfig.for_model(**value))
        elif name not in ("id2label", "label2id") and not name.startswith("_"):
            values[name] = _shrink_value(name, value)
    _restore_invariants(config, values, original_layers)
    return values


def _restore_invariants(config, values: dict, original_layers: int | None) -> None:
    # Widths must divide into heads.
    width_keys = [k for k in ("hidden_size", "d_model", "n_embd", "embed_dim", "dim") if isinstance(values.get(k), int)]
    head_keys = [k for k in values if re.fullmatch(r"num_attention_heads|n_heads?|num_heads|encoder_attention_heads"
                                                   r"|decoder_attention_heads", k) and isinstance(values[k], int)]
    for width_key in width_keys:
        for head_key in head_keys:
            heads = values[head_key]
            while heads > 1 and values[width_key] % heads:
                heads -= 1
            values[head_key] = heads
    heads = next((values[k] for k in head_keys), None)
    for key in ("num_key_value_heads", "num_kv_heads", "n_kv_heads"):
        if isinstance(values.get(key), int) and heads:
            kv = min(values[key], heads)
            while heads % kv:
                kv -= 1
            values[key] = kv
    # A separate head_dim kept from the defaults would not match the new width.
    if values.get("head_dim") is not None and width_keys and heads:
        values["head_dim"] = values[width_keys[0]] // heads
    # Rotary sizes live inside the head.
    head_dim = values.get("head_dim") or (values[width_keys[0]] // heads if width_keys and heads else None)
    if isinstance(values.get("rotary_dim"), int) and head_dim:
        values["rotary_dim"] = min(values["rotary_dim"], head_dim)
    if head_dim:
        _fit_rope_sections(type(config), values, head_dim)
    # Lists with one entry per layer follow the layer count.
    layers = _layers_of(values)
    if original_layers and layers and layers != original_layers:
        for key, value in list(values.items()):
            if isinstance(value, (list, tuple)) and len(value) == original_layers and not _int_list(value):
                values[key] = type(value)(_fit_per_layer_list(list(value), layers))
            elif key.endswith(("_indexes", "_indices", "_layer_ids", "_layers_idx")) and _int_list(value):
                kept = [index for index in value if 0 <= index < layers]
                values[key] = type(value)(kept or [layers - 1])
    _fit_token_ids(values)


def _fit_token_ids(values: dict) -> None:
    """Special token ids outside the new vocabulary move to its top, clear of the ids sub-configs already use.

    A multimodal config keeps its placeholder ids (``image_token_id``) at the top level and its vocabulary in
    ``text_config``: the text vocabulary decides there.
    """
    vocab = values.get("vocab_size")
    if not isinstance(vocab, int):
        vocab = next((v.vocab_size for v in values.values() if _is_config(v) and getattr(v, "vocab_size", None)), None)
    if not isinstance(vocab, int) or vocab < SPECIAL_FLOOR:
        return
    taken = set().union(*(special_token_ids(v) for v in values.values() if _is_config(v)))
    for key in sorted(values):
        value = values[key]
        if not _TOKEN_ID.search(key):
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            if value >= vocab:
                values[key] = next(i for i in range(vocab - 1, SPECIAL_FLOOR - 1, -1) if i not in taken)
            taken.add(values[key])
        elif _int_list(value):
            values[key] = type(value)(v if v < vocab else vocab - 1 - (i % 4) for i, v in enumerate(value))


# Qwen-VL models fall back to these sections when the config names none (for a 128-wide head).
_DEFAULT_MROPE_SECTION = [16, 24, 24]


def _fit_rope_sections(config_class, values: dict, head_dim: int) -> None:
    """Multimodal rotary sections (``mrope_section``) must sum to half the head dimension."""
    rope = values.get("rope_parameters")
    if not isinstance(rope, dict):
        return
    if "mrope_section" in getattr(config_class, "ignore_keys_at_rope_validation", ()) and "mrope_section" not in rope:
        rope = values["rope_parameters"] = {**rope, "mrope_section": list(_DEFAULT_MROPE_SECTION)}
    for key in ("mrope_section", "mrope_sections"):
        sections = rope.get(key)
        if _int_list(sections) and sum(sections) != head_dim // 2:
            half, total = head_dim // 2, sum(sections)
            scaled = [max(1, s * half // total) for s in sections]
            scaled[-1] += half - sum(scaled)
            values["rope_parameters"] = {**rope, key: type(sections)(scaled)}


def tiny_from(config):
    """A tiny config of the same class as ``config``, shrunk from its current values."""
    return type(config)(**shrink(config))


def _apply_overrides(values: dict, overrides: dict) -> None:
    for dotted, value in overrides.items():
        target = values
        *parents, leaf = dotted.split(".")
        for parent in parents:
            sub = target[parent]
            if _is_config(sub):
                sub = sub.to_dict()
            target[parent] = dict(sub) if isinstance(sub, dict) else sub
            target = target[parent]
        target[leaf] = value


def tiny_config(model_type: str):
    """The tiny config of ``model_type``: defaults, shrunk, then its ``TINY_OVERRIDES`` row."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    values = shrink(config_class())
    _apply_overrides(values, TINY_OVERRIDES.get(model_type, {}))
    return config_class(**values)


def special_token_ids(config) -> set[int]:
    """Every token id a config reserves (pad, image placeholders, ...), in it and its sub-configs."""
    found: set[int] = set()
    for key, value in vars(config).items():
        if _is_config(value):
            found |= special_token_ids(value)
        elif _TOKEN_ID.search(key):
            if isinstance(value, int) and not isinstance(value, bool):
                found.add(value)
            elif _int_list(value):
                found.update(value)
    return found


def text_vocab(config) -> int:
    """The vocabulary size of the text part of ``config``."""
    for candidate in (config, getattr(config, "text_config", None), getattr(config, "decoder", None)):
        vocab = getattr(candidate, "vocab_size", None) if candidate is not None else None
        if isinstance(vocab, int):
            return vocab
    return VOCAB


