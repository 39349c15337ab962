"""A tiny config for every model type, from the config class's defaults alone (no hub, no test files).

Every size is shrunk by the rules in ``_RULES`` (matched on the attribute name), recursing into sub-configs, with
one width, one feed-forward size and one head count everywhere, so sizes that must agree across sub-configs
(a projector's input and a vision tower's output) agree by construction. Then the invariants models assert are
restored (heads divide widths, kv heads divide heads, token ids inside the vocabulary, per-layer lists as long as
the layer count), and the per-model-type rows of ``TINY_OVERRIDES`` are applied last.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import re
from typing import Any

from .tables import BUILT_FROM, TINY_OVERRIDES

WIDTH = 32  # every hidden size, embedding size, projection size
FFN = 64  # every feed-forward size
HEADS = 4
KV_HEADS = 2
HEAD_DIM = WIDTH // HEADS
LAYERS = 2
MAX_LAYERS = 4  # when a model selects several layers' outputs (DPT necks), it gets up to this many
VOCAB = 128  # ids >= SPECIAL_FLOOR are kept for special tokens; inputs draw from below it
SPECIAL_FLOOR = 100
POSITIONS = 128
IMAGE = 32
PATCH = 8
EXPERTS = 4
EXPERTS_PER_TOKEN = 2
WINDOW = 4

_PLACEHOLDER = re.compile(r"^(image|video|audio)_token_(id|index)$")
_TOKEN_ID = re.compile(r"(^|_)(token_id|token_index|token_ids|start_token_id|id)$|_token_(id|index)$")


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_list(value) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(_int(v) for v in value)


def _cap(limit):
    """Cap an int, or each int of a list, at ``limit``: the same value always maps to the same value, so sizes
    that must agree (a backbone's output channels, a neck's input channels) still agree after shrinking."""

    def rule(value):
        if _int(value):
            return min(value, limit)
        if _int_list(value):
            return [min(v, limit) for v in value]
        return value

    return rule


def _dividing(count: int, total: int) -> int:
    """The largest number no greater than ``count`` that divides ``total``."""
    count = min(count, total)
    while total % count:
        count -= 1
    return count


def _heads(value):
    """Head counts become powers of two, at most ``HEADS``: they must divide widths that stages double."""

    def fit(count):
        return max(1, min(HEADS, 1 << (count.bit_length() - 1))) if count > 0 else count

    if _int(value):
        return fit(value)
    if _int_list(value):
        return [fit(v) for v in value]
    return value


def _big_only(limit, floor):
    """Cap only values of at least ``floor`` (a sliding window of 4096 tokens, not a window of 7 patches)."""

    def rule(value):
        return min(value, limit) if _int(value) and value >= floor else value

    return rule


def _image(value):
    if _int(value) and value >= 64:
        return IMAGE
    if _int_list(value) and min(value) >= 64:
        return [IMAGE] * len(value)
    return value


# (attribute-name pattern, rule(value) -> new value), first match wins; None keeps the value.
_RULES: list[tuple[re.Pattern, Any]] = [
    (r"^(num_feat_extract_layers|num_conv_pos_embedding_groups|num_conv_pos_embeddings|num_mel_bins|feature_size"
     r"|sampling_rate)$", None),
    # input channels (3 for an image) stay; per-block channel lists shrink with their output lists
    (r"^(num_channels|in_channels|input_channels|audio_channels|image_channels)$",
     lambda v: _cap(WIDTH)(v) if _int_list(v) else v),
    # image tokens pooled from the 16 patches of a tiny image (and placed in the text: they must fit its length)
    (r"^(mm_tokens_per_image|latent_query_num)$", _cap(4)),
    (r"^(first_k_dense_replace|num_dense_layers|insert_layer_id|max_window_layers)$", _cap(1)),
    (r"^(num_hidden_layers|num_layers|n_layers?|encoder_layers|decoder_layers|num_encoder_layers"
     r"|num_decoder_layers|depth|num_blocks|\w+_layers|\w+_depth|num_hidden_blocks)$", _cap(LAYERS)),
    (r"^(num_key_value_heads|num_kv_heads|n_kv_heads|multi_query_group_num|\w+_kv_heads|\w+_key_value_heads)$",
     _cap(KV_HEADS)),
    (r"^(num_attention_heads|n_heads?|num_heads|encoder_attention_heads|decoder_attention_heads|attention_heads"
     r"|\w+_attention_heads|\w+_num_heads|\w+_n_heads|num_\w+_heads)$", _heads),
    (r"^(qk_rope_head_dim|qk_nope_head_dim|v_head_dim|head_dim|d_head|d_kv|kv_channels|dim_head|attention_head_dim"
     r"|\w+_head_dim|head_size)$", _cap(HEAD_DIM)),
    (r"^(kv_lora_rank|q_lora_rank|\w+_lora_rank)$", _cap(16)),
    (r"^(num_experts|num_local_experts|n_routed_experts|moe_num_experts|num_experts_per_layer|n_experts)$",
     _cap(EXPERTS)),
    (r"^(num_experts_per_tok|moe_topk|top_k|num_selected_experts|moe_k|router_topk|num_experts_per_token)$",
     _cap(EXPERTS_PER_TOKEN)),
    (r"^(n_shared_experts|num_shared_experts|moe_num_shared_experts)$", _cap(1)),
    # a default init scale of 1e-10 (SAM-style encoders) leaves a random tower blind: every image looks the same
    (r"^initializer_range$", lambda v: 0.02 if isinstance(v, float) and v < 1e-4 else v),
    (r"^(num_queries|num_denoising)$", _cap(8)),  # detectors pick their queries by top-k over a few feature cells
    (r"^(n_group|topk_group)$", _cap(1)),
    (r"^num_groups$", _cap(4)),  # group norms: must divide channels as small as 8
    (r"^upsample_groups$", _cap(WIDTH)),  # a depthwise upsampling (Mimi's): one group per channel
    (r"^(\w+_)?n_groups$", _cap(1)),  # state-space groups must divide the (fewer) heads
    (r"^(\w+_)?layer_offset$", _cap(1)),  # hybrids: the first attention / expert layer must exist
    (r"^(\w+_)?layer_period$", _cap(2)),
    (r"(^|_)vocab_size$|^vocab_size_per_layer_input$", _big_only(VOCAB, 17)),
    (r"^(max_position_embeddings|n_positions|max_source_positions|max_target_positions|max_seq_len"
     r"|max_sequence_length|n_ctx|max_length|context_length|\w+_max_position_embeddings)$",
     _big_only(POSITIONS, POSITIONS)),
    (r"^(sliding_window|attention_window)$", _big_only(WINDOW, 64)),
    (r"^num_frames$", _cap(4)),
    (r"(intermediate_size|ffn_dim|^d_ff$|^n_inner$|mlp_dim|intermediate_dim|ffn_hidden_size|^dim_feedforward$)",
     _cap(FFN)),
    (r"^(image_size|img_size)$", _image),
    (r"^patch_size$", _big_only(PATCH, PATCH)),
    (r"^(depths|layers_per_stage|num_layers_per_stage|stage_depths)$", _cap(1)),
    (r"^pos_emb_(height|width)$", None),  # a position grid (square for Kimi-K2.5's resampling), not a width
    # every other width: hidden sizes, embeddings, projections, per-stage channel lists
    (r"(hidden_size|d_model|n_embd|embed_dim|hidden_dim|embedding_size|embedding_dim|projection_dim|proj_dim"
     r"|projection_size|proj_size|projector_dim|d_embed|model_dim|_width$|^width$|widths|^dim$|^dims$|output_dim"
     r"|channels$|_channels|num_filters|latent_dim|codebook_dim|conv_dim|tdnn_dim|hidden_sizes|embed_dims|_in_dim$|_out_dim$"
     r"|embedding_dims|^emb_dim$|^upsample_initial_channel$|^pooler_output_size$|_out_channel$)", _cap(WIDTH)),
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


def _fit_per_layer_list(values: list, layers: int) -> list:
    """A list with one entry per layer, cut to ``layers`` entries, keeping each distinct kind where it can."""
    kinds = list(dict.fromkeys(values)) if all(isinstance(v, (str, int, type(None))) for v in values) else values
    if len(kinds) <= layers:
        return kinds + [values[-1]] * (layers - len(kinds))
    return list(values[:layers])


def _fit_layer_indices(indices: list, original: int, layers: int) -> list:
    """Layer indices (``global_attn_indexes=[2, 5, 8, 11]``) spread over the new depth in the same order; the
    count is kept, since other lists are sized by it (one neck input per index)."""
    positive = sorted({i for i in indices if i >= 0})
    if len(positive) <= 1:
        return [min(layers - 1, i * layers // max(original, 1)) if i >= 0 else i for i in indices]
    spread = {old: round(rank * (layers - 1) / (len(positive) - 1)) for rank, old in enumerate(positive)}
    if max(positive) >= original:  # 1-based (stage numbers): keep them 1-based
        spread = {old: new + 1 for old, new in spread.items()}
    return [spread.get(i, i) for i in indices]


def _set_layers(values: dict, layers: int) -> int:
    for key in ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "decoder_layers", "encoder_layers"):
        if _int(values.get(key)):
            values[key] = layers
    return layers


_LAYER_INDEX_LIST = re.compile(r"(_indexes|_indices|_idxs?|_layer_ids|_layers|_layer_idx)$")
_BACKBONE_FIELDS = {"use_timm_backbone": False, "use_pretrained_backbone": False}


def _own_values(config, fields) -> dict:
    """Field values as stored, without triggering per-layer attribute guards (``config.head_dim`` may raise)."""
    stored = vars(config)
    values = {}
    for name in fields:
        if name in stored:
            values[name] = stored[name]
        else:
            try:
                values[name] = getattr(config, name)
            except AttributeError:
                continue
    return values


def _without_timm(config):
    """A timm backbone becomes transformers' own ResNet with the same outputs: timm cannot load here."""
    if getattr(config, "model_type", "") != "timm_backbone":
        return config
    from transformers import ResNetConfig

    out_indices = list(getattr(config, "out_indices", None) or [1, 2, 3, 4])
    return ResNetConfig(num_channels=getattr(config, "num_channels", 3), out_indices=out_indices)


def shrink(config, overrides: dict | None = None) -> dict:
    """The keyword arguments that build a tiny version of ``config`` (its class' fields only); ``overrides``
    (dotted keys reach into sub-configs) are applied before the invariants are restored."""
    fields = _init_fields(type(config))
    current = _own_values(config, fields)
    original_layers = _layers_of(current)
    # flags a parent's defaults set on a sub-config beyond its fields (CHMv2 asks its DINOv3 backbone for class tokens)
    values: dict[str, Any] = {
        name: value for name, value in vars(config).items()
        if isinstance(value, bool) and not name.startswith("_") and name not in fields
    }
    for name, value in current.items():
        if name.startswith("_") or name in ("id2label", "label2id"):
            continue
        if isinstance(value, dict) and isinstance(value.get("model_type"), str):
            from transformers import AutoConfig

            value = AutoConfig.for_model(**value)
        if _is_config(value):
            values[name] = tiny_from(_without_timm(value), _under(name, overrides or {}))
        elif name in _BACKBONE_FIELDS:
            values[name] = _BACKBONE_FIELDS[name]  # timm and hub weights are not here: the built-in backbone is
        else:
            values[name] = _shrink_value(name, value)
    if vars(config).get("_out_indices") is not None:  # backbones keep it behind a property
        values["out_indices"] = list(vars(config)["_out_indices"])
    if "vocab_size" in values and values["vocab_size"] is None:
        values["vocab_size"] = VOCAB  # heads like CTC need one
    # Mixture-of-experts sizes some defaults leave unset although the model reads them.
    if values.get("num_experts_per_tok", 0) is None and any(_int(values.get(k)) for k in ("n_routed_experts", "num_experts")):
        values["num_experts_per_tok"] = EXPERTS_PER_TOKEN
    if "moe_intermediate_size" in values and values["moe_intermediate_size"] is None:
        values["moe_intermediate_size"] = FFN
    if "prediction_length" in values and values["prediction_length"] is None:  # time series: required, no default
        values["prediction_length"] = 8
    if "attn_layer_indices" in values and values["attn_layer_indices"] is None:
        values["attn_layer_indices"] = [LAYERS - 1]  # hybrids: keep one attention layer among the few left
    if "pad_token_id" in values and values["pad_token_id"] is None and _int(values.get("vocab_size")):
        values["pad_token_id"] = 0  # sequence classification finds the last token through it; inputs never hold 0
    _apply_overrides(values, overrides or {})
    _restore_invariants(config, values, original_layers)
    return values


def _restore_invariants(config, values: dict, original_layers: int | None) -> None:
    # Widths must divide into heads.
    width_keys = [k for k in ("hidden_size", "d_model", "n_embd", "embed_dim", "dim") if _int(values.get(k))]
    head_keys = [k for k in values if re.fullmatch(r"num_attention_heads|n_heads?|num_heads|encoder_attention_heads"
                                                   r"|decoder_attention_heads", k) and _int(values[k])]
    for width_key in width_keys:
        for head_key in head_keys:
            values[head_key] = _dividing(values[head_key], values[width_key])
    heads = next((values[k] for k in head_keys), None)
    original = vars(config)
    # key/value heads divide their query heads, per attention kind ("swa_num_key_value_heads" goes with
    # "swa_num_attention_heads"); multi-head attention stays multi-head (MLA expands keys to every head)
    for key in list(values):
        kv_key = re.fullmatch(r"(\w+_)?(num_key_value_heads|num_kv_heads|n_kv_heads)(_per_layer)?", key)
        if not kv_key:
            continue
        prefix = kv_key.group(1) or ""
        query_key = next((k for k in (f"{prefix}num_attention_heads", f"{prefix}num_heads") if _int(values.get(k))), None)
        query_heads = values[query_key] if query_key else heads
        if not query_heads:
            continue
        if values[key] is None or original.get(key) == original.get(query_key or head_keys[0] if head_keys else key):
            values[key] = query_heads
            continue
        if _int(values[key]):
            values[key] = _dividing(values[key], query_heads)
        elif _int_list(values[key]):  # one count per layer (Sapiens 2)
            values[key] = [_dividing(kv, query_heads) for kv in values[key]]
    # multi-head latent attention: the query/key head is the no-rope part plus the rope part
    if _int(values.get("qk_head_dim")) and _int(values.get("qk_nope_head_dim")) and _int(values.get("qk_rope_head_dim")):
        values["qk_head_dim"] = values["qk_nope_head_dim"] + values["qk_rope_head_dim"]
    # A separate head_dim kept from the defaults would not match the new width; an unset one is spelled out,
    # since some models read it without a fallback.
    if "head_dim" in values and (values["head_dim"] is None or _int(values["head_dim"])) and width_keys and heads:
        values["head_dim"] = values[width_keys[0]] // heads
    _fit_state_space_heads(values, width_keys)
    # Rotary sizes live inside the head.
    head_dim = values.get("head_dim") if _int(values.get("head_dim")) else None
    head_dim = head_dim or (values[width_keys[0]] // heads if width_keys and heads else None)
    if _int(values.get("rotary_dim")) and head_dim:
        values["rotary_dim"] = min(values["rotary_dim"], head_dim)
    if head_dim:
        _fit_rope_sections(type(config), values, head_dim)
    # Windows counted in pixels keep their size in patches; windows counted in tokens shrink with the image.
    if _int(values.get("window_size")) and _int(values.get("patch_size")) and _int(getattr(config, "patch_size", None)):
        old_patch, window = config.patch_size, values["window_size"]
        if window >= old_patch and window % old_patch == 0:
            values["window_size"] = window // old_patch * values["patch_size"]
        elif window < 64 and ("image_size" in values):
            values["window_size"] = min(window, 2)
    # Hierarchical windowed vision models halve the resolution per stage: the last stage must still hold a window.
    depths, window, patch = values.get("depths"), values.get("window_size"), values.get("patch_size")
    if _int_list(depths) and _int(window) and _int(patch) and _int(values.get("image_size")):
        values["image_size"] = max(values["image_size"], window * patch * 2 ** (len(depths) - 1))
    # Lists with one entry per layer follow the layer count; lists of layer indices move into it, each index to
    # its own layer (models select hidden states by membership, so two indices must not collapse into one).
    layers = _layers_of(values)
    index_lists = [k for k, v in values.items() if _LAYER_INDEX_LIST.search(k) and _int_list(v)]
    kinds_lists = [v for v in values.values() if isinstance(v, (list, tuple)) and len(v) == original_layers
                   and original_layers >= 4 and not _int_list(v)]  # fmt: skip
    if original_layers and layers and (index_lists or kinds_lists):
        needed = max([len(set(values[k])) for k in index_lists] + [len(set(map(str, v))) for v in kinds_lists])
        if min(MAX_LAYERS, needed) > layers:  # room for every selected layer, and for every kind of layer
            layers = _set_layers(values, min(MAX_LAYERS, needed))
    if original_layers and layers and layers != original_layers:
        for key, value in list(values.items()):
            if isinstance(value, (list, tuple)) and len(value) == original_layers and original_layers >= 4:
                values[key] = _fit_per_layer_list(list(value), layers)
            elif _LAYER_INDEX_LIST.search(key) and _int_list(value) and max(value) < original_layers + 1:
                values[key] = _fit_layer_indices(list(value), original_layers, layers)
    # Backbones derive their stage names and output features from the layer count and out_indices.
    if _int_list(values.get("out_indices")):
        values.pop("stage_names", None)
        values.pop("out_features", None)
    _fit_token_ids(values)


def _fit_state_space_heads(values: dict, width_keys: list[str]) -> None:
    """Mamba-2 style mixers split ``expand * hidden_size`` into ``heads * head_dim`` exactly."""
    if not width_keys:
        return
    width = values[width_keys[0]]
    for prefix in ("", "mamba_", "ssm_"):
        expand = values.get(f"{prefix}expand")
        heads_key = next((k for k in (f"{prefix}n_heads", f"{prefix}num_heads") if _int(values.get(k))), None)
        dim_key = next((k for k in (f"{prefix}d_head", f"{prefix}head_dim") if k in values), None)
        inner = values.get(f"{prefix}d_ssm")  # an explicit inner size replaces expand * hidden_size
        if _int(inner):
            inner = values[f"{prefix}d_ssm"] = min(inner, expand * width if _int(expand) else WIDTH)
        elif _int(expand):
            inner = expand * width
        if _int(inner) and heads_key and dim_key and inner % values[heads_key] == 0:
            values[dim_key] = inner // values[heads_key]


def _fit_token_ids(values: dict) -> None:
    """Special token ids outside the new vocabulary move to its top, clear of the ids sub-configs already use.

    A multimodal config keeps its placeholder ids (``image_token_id``) at the top level and its vocabulary in
    ``text_config``: the text vocabulary decides there.
    """
    vocab = values.get("vocab_size")
    if not isinstance(vocab, int):
        # a sub-config an override touched is a dict by now
        subs = [v for v in values.values() if isinstance(v, dict) or _is_config(v)]
        vocabs = (v.get("vocab_size") if isinstance(v, dict) else getattr(v, "vocab_size", None) for v in subs)
        vocab = next((v for v in vocabs if _int(v)), None)
    if not isinstance(vocab, int) or vocab < SPECIAL_FLOOR:
        return
    taken = special_token_ids(values)
    for key in sorted(values):
        value = values[key]
        if not _TOKEN_ID.search(key):
            continue
        if value is None and _PLACEHOLDER.match(key):  # placeholders the model looks for must exist
            value = values[key] = vocab
        if value is None:
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            if value >= vocab:
                values[key] = _free_token_id(vocab, taken)
            taken.add(values[key])
        elif _int_list(value):  # distinct ids stay distinct (Ovis2's visual indicators beside its image token)
            moved = {}
            for old in value:
                if old >= vocab and old not in moved:
                    moved[old] = _free_token_id(vocab, taken)
                    taken.add(moved[old])
            values[key] = [moved.get(v, v) for v in value]


def _free_token_id(vocab: int, taken: set[int]) -> int:
    """The highest id of the vocabulary no special token holds yet (its top one when the special range is full)."""
    return next((i for i in range(vocab - 1, SPECIAL_FLOOR - 1, -1) if i not in taken), vocab - 1)


# Qwen-VL models fall back to these sections when the config names none (for a 128-wide head).
_DEFAULT_MROPE_SECTION = [16, 24, 24]


@functools.cache
def _reads_rope_sections(config_class) -> bool:
    """Whether the model splits its rotary by sections: declared by the config, or read by the model with a default
    of its own (PaddleOCR-VL)."""
    if "mrope_section" in getattr(config_class, "ignore_keys_at_rope_validation", ()):
        return True
    try:
        modeling = importlib.import_module(config_class.__module__.replace(".configuration_", ".modeling_"))
        return 'get("mrope_section"' in inspect.getsource(modeling)
    except Exception:  # no modeling module, or an optional package it needs
        return False


def _fit_rope_sections(config_class, values: dict, head_dim: int) -> None:
    """Multimodal rotary sections (``mrope_section``) must sum to half the head dimension (or of its rotary part,
    which a row may choose: GLM-4V-MoE's)."""
    rope = values.get("rope_parameters")
    if not isinstance(rope, dict):
        return
    rotary_half = int(head_dim * (rope.get("partial_rotary_factor") or 1)) // 2
    if _reads_rope_sections(config_class) and rope.get("rope_type") == "default" and "mrope_section" not in rope:
        rope = values["rope_parameters"] = {**rope, "mrope_section": list(_DEFAULT_MROPE_SECTION)}
    for key in ("mrope_section", "mrope_sections"):
        sections = rope.get(key)
        if _int_list(sections) and sum(sections) not in (head_dim // 2, rotary_half):
            half, total = head_dim // 2, sum(sections)
            scaled = [max(1, s * half // total) for s in sections]
            scaled[-1] += half - sum(scaled)
            values["rope_parameters"] = {**rope, key: type(sections)(scaled)}


def tiny_from(config, overrides: dict | None = None):
    """A tiny config of the same class as ``config``, shrunk from its current values, with its model type's row and
    ``overrides`` (a sub-config checks itself when built: its parent's row must apply then, not only after)."""
    own_row = TINY_OVERRIDES.get(getattr(config, "model_type", ""), {})
    return type(config)(**shrink(config, {**own_row, **(overrides or {})}))


def _under(name: str, overrides: dict) -> dict:
    """The dotted ``overrides`` below ``name``, relative to it."""
    return {key.removeprefix(f"{name}."): value for key, value in overrides.items() if key.startswith(f"{name}.")}


def _apply_overrides(values: dict, overrides: dict) -> None:
    for dotted, value in overrides.items():
        target = values
        *parents, leaf = dotted.split(".")
        if parents and values.get(parents[0]) is None:
            continue  # a class of the model type built from a config without that part (Emu3's text-only LM)
        for parent in parents:
            sub = target[parent]
            if _is_config(sub):
                sub = sub.to_dict()
            target[parent] = dict(sub) if isinstance(sub, dict) else sub
            target = target[parent]
        target[leaf] = value


def tiny_config(model_class):
    """The tiny config of a ``ModelClass``: its config class' defaults, shrunk, then its model type's
    ``TINY_OVERRIDES`` row."""
    built_from = BUILT_FROM.get(model_class.name)
    if built_from:
        config_class = getattr(importlib.import_module("transformers"), built_from)
    else:
        config_class = getattr(model_class.load(), "config_class", None) or model_class.config_class()
    # the row of the config class built too, when a class of one model type takes another's (a text-only head); a
    # class built from a sub-config takes that config's row alone (its own type's row is the composite's)
    overrides = {**TINY_OVERRIDES.get(getattr(config_class, "model_type", ""), {}),
                 **({} if built_from else TINY_OVERRIDES.get(model_class.model_type, {}))}
    fields = _init_fields(config_class)
    # what the class' name says about the config it needs
    if "is_decoder" in fields and model_class.name.endswith(("ForCausalLM", "LMHeadModel", "WithLMHead")):
        overrides.setdefault("is_decoder", True)
    if "is_encoder_decoder" in fields and model_class.name.endswith("EncoderModel"):
        overrides.setdefault("is_encoder_decoder", False)
    # ESMFold: the language model and its folding trunk, whose sub-configs exist only then and must be shrunk too
    folding = {"is_folding_model": True} if model_class.name.endswith("ForProteinFolding") else {}
    return config_class(**shrink(_defaults(config_class, overrides, folding), {**folding, **overrides}))


def _defaults(config_class, overrides: dict, built_in: dict):
    """The config class' defaults (with ``built_in`` fields that add sub-configs). A default that fails its own
    validation (Gemma 4 assistant's text config) is built again seeded with the overrides that reach one level into
    its sub-configs."""
    try:
        return config_class(**built_in)
    except Exception:
        seeded: dict[str, dict] = {}
        for dotted, value in overrides.items():
            parent, _, leaf = dotted.partition(".")
            if leaf and "." not in leaf:
                seeded.setdefault(parent, {})[leaf] = value
        if not seeded:
            raise
        return config_class(**built_in, **seeded)


def special_token_ids(config) -> set[int]:
    """Every token id a config reserves (pad, image placeholders, ...), in it and its sub-configs; a config's values
    as a dict serve too (a sub-config an override touched is one)."""
    found: set[int] = set()
    for key, value in (config if isinstance(config, dict) else vars(config)).items():
        if _is_config(value) or isinstance(value, dict):
            found |= special_token_ids(value)
        elif isinstance(key, str) and _TOKEN_ID.search(key):
            if isinstance(value, int) and not isinstance(value, bool):
                found.add(value)
            elif _int_list(value):
                found.update(value)
    return found


def text_vocab(config) -> int:
    """The vocabulary size of the text part of ``config``."""
    candidates = (config, *(getattr(config, name, None) for name in ("text_config", "decoder", "model_config")))
    for candidate in candidates:  # model_config: FastSpeech 2 inside its vocoder wrapper
        vocab = getattr(candidate, "vocab_size", None) if candidate is not None else None
        if isinstance(vocab, int):
            return vocab
    return VOCAB


