"""Stage 2 model patches: attention masks and kernels: SDPA's causal choice as eager makes it, masks built by
broadcasting, no mask without padding; and packed-sequence attention as one masked SDPA (`segmented_attention`, a
switch on the model's configs rather than a patch).
"""

from __future__ import annotations

import functools
import inspect
from contextlib import contextmanager

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ...registration import applied_reporter, register_patch, register_switch, report_applied


# ── Stage 2: Model patches ───────────────────────────────────────────────────


@register_patch(
    "dynamo", "transformers.modeling_utils.AttentionInterface.get_interface", reports=True,
    model_side="PaliGemma's text model as used by ColPali and Aimv2TextModel set their attention modules' "
               "`is_causal` to match the causal mask they build (or build a bidirectional mask), so eager's "
               "dropping of a padding-free mask and the exported masked SDPA attend the same way.",
)
def _patch_sdpa_skips_a_future_only_mask_as_eager_does(original):
    """Without padding, eager drops the causal mask and SDPA follows the attention module's own `is_causal`. Models
    whose modules are not causal but whose masks are (ColPali's PaliGemma, Aimv2's text tower) then attend
    everywhere in eager; under export the mask cannot be checked for padding, so it is kept and the program attends
    causally. For such a module, a mask that hides the future and nothing else is read as no mask, chosen inside the
    program: eager's numbers, with padding or without."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    as_eager_reads = {}  # one reading per mask: every layer gets the same mask object

    def sdpa_like_eager(report, module, query, key, value, attention_mask, *args, **kwargs):
        # causal if the caller says so (OmDet-Turbo's text encoder) or the module's own flag does: an `is_causal=False`
        # argument is often derived from the mask being there (Moonshine's decoder), which eager drops and the trace
        # keeps
        module_is_causal = kwargs.get("is_causal") or getattr(module, "is_causal", True)
        # square by its shapes' symbols, not their traced sizes: asking whether a cross-attention's decoder length
        # equals its encoder's merged the two axes of the program when they were traced equal
        square = (
            attention_mask is not None and attention_mask.dtype == torch.bool
            and statically_known_true(query.shape[2] == key.shape[2])
            and statically_known_true(attention_mask.shape[-2] == attention_mask.shape[-1])
        )
        if module_is_causal or not square:
            return sdpa_attention_forward(module, query, key, value, attention_mask, *args, **kwargs)
        report()
        if id(attention_mask) not in as_eager_reads:
            future_hidden = torch.ones(attention_mask.shape[-2:], dtype=torch.bool, device=attention_mask.device)
            only_future = (attention_mask == future_hidden.tril()).all()
            as_eager_reads[id(attention_mask)] = (attention_mask, attention_mask | only_future)  # keeps the id's owner
        return sdpa_attention_forward(module, query, key, value, as_eager_reads[id(attention_mask)][1], *args, **kwargs)

    def get_interface(self, attn_implementation, default):
        found = original(self, attn_implementation, default)
        if found is not sdpa_attention_forward:
            return found
        return functools.partial(sdpa_like_eager, applied_reporter())  # it runs after this call returns

    return get_interface


@register_patch(
    "dynamo", "transformers.modeling_utils.AttentionInterface.get_interface", reports=True,
    model_side="VideoMAEEmbeddings (VideoMAEForPreTraining) gathers the visible patches with a count known from "
               "the mask (e.g. a fixed number per sample via argsort of bool_masked_pos) instead of "
               "`embeddings[~bool_masked_pos].reshape(batch_size, -1, C)`, so transformers' "
               "sdpa_attention_forward's `q_length > 1` and SDPA's own checks see a backed length.",
)
def _patch_sdpa_on_queries_counted_from_data(original):
    """transformers' SDPA first asks `query length > 1` to pick the causal kernel. When that length was counted from
    data (VideoMAE pre-training encodes only the patches its mask leaves visible) the question has no answer in the
    trace, nor has the kernel's own check for an empty query. A module that is not causal needs neither: it gets
    SDPA's arithmetic written out, which asks nothing about the length."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    from transformers.integrations.sdpa_attention import repeat_kv

    def sdpa_not_asking_the_length(report, found, module, query, key, value, attention_mask, *args, **kwargs):
        causal = kwargs.get("is_causal") or getattr(module, "is_causal", True)
        extras = args or any(kwargs.get(name) is not None for name in ("position_bias", "cache", "softcap"))
        if causal or extras or not free_unbacked_symbols(query.shape[2]):
            return found(module, query, key, value, attention_mask, *args, **kwargs)
        report()
        groups = getattr(module, "num_key_value_groups", 1)
        if groups > 1:
            key, value = repeat_kv(key, groups), repeat_kv(value, groups)
        scores = query @ key.transpose(-1, -2) * (kwargs.get("scaling") or query.shape[-1] ** -0.5)
        if attention_mask is not None and attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
        elif attention_mask is not None:
            scores = scores + attention_mask
        weights = torch.nn.functional.dropout(scores.softmax(-1), kwargs.get("dropout", 0.0), module.training)
        return (weights @ value).transpose(1, 2).contiguous(), None

    def get_interface(self, attn_implementation, default):
        found = original(self, attn_implementation, default)
        if attn_implementation != "sdpa":
            return found
        return functools.partial(sdpa_not_asking_the_length, applied_reporter(), found)

    return get_interface


@register_patch(
    "dynamo", "transformers.models.phi4_multimodal.modeling_phi4_multimodal.create_bidirectional_mask",
    reports=True,
    model_side="Phi4MultimodalVisionAttention sets `is_causal = False` (its SigLIP-style tower builds a "
               "bidirectional mask), so eager dropping a padding mask that hides nothing no longer switches the "
               "patches to causal attention.",
)
def _patch_phi4_vision_mask_causal_when_it_hides_nothing(original):
    """Phi-4-multimodal's vision attention modules are flagged causal. Eager drops a padding mask that hides
    nothing, and SDPA then follows the flag: the patches attend causally. Under export the mask cannot be checked,
    so it is kept and the program attends everywhere (its last hidden state 3.3 off eager's). Inside the program a
    mask that hides nothing becomes the causal one (see `_patch_sdpa_skips_a_future_only_mask_as_eager_does` for
    the converse): eager's numbers, with padding or without."""

    def create_bidirectional_mask(config, inputs_embeds, attention_mask, *args, **kwargs):
        mask = original(config, inputs_embeds, attention_mask, *args, **kwargs)
        if attention_mask is None or not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            return mask
        report_applied()
        causal = torch.ones(mask.shape[-2:], dtype=torch.bool, device=mask.device).tril()
        return mask & (causal | ~attention_mask.bool().all())

    return create_bidirectional_mask


@register_patch(
    "dynamo", "transformers.masking_utils._vmap_expansion_sdpa",
    model_side="transformers' masking_utils builds masks with and/or overlays (Gemma 3's bidirectional image "
               "blocks) with the broadcast `_non_vmap_expansion_sdpa` path as well, instead of falling back to "
               "`_vmap_expansion_sdpa`.",
)
def _patch_mask_by_broadcast(_original):
    """A mask with a custom overlay (Gemma 3's bidirectional image blocks) is built with `torch.vmap`, which traces,
    but leaves batching ops that torch.onnx and ExecuTorch's decompositions reject ("tensor may have escaped from
    inside a function being vmapped"). transformers' overlays index their inputs by position tensors, so the
    broadcast expansion its default masks use builds the same mask without vmap."""
    from transformers.masking_utils import _non_vmap_expansion_sdpa

    def expansion(mask_function):
        def expanded(batch, head, query, key):
            mask = mask_function(*_non_vmap_expansion_sdpa(batch, head, query, key))
            return mask.expand(batch.shape[0], head.shape[0], query.shape[0], key.shape[0])

        return expanded

    return expansion


@register_patch(
    "dynamo", "transformers.masking_utils._ignore_bidirectional_mask_sdpa", reports=True,
    model_side="transformers' masking_utils._ignore_bidirectional_mask_sdpa returns True when padding_mask is "
               "None (and no local-attention constraint applies) even while exporting, since there are no mask "
               "values to check.",
)
def _patch_no_padding_means_no_mask(original):
    """Without a padding mask, eager attends everywhere with no mask at all, but under export transformers builds
    one anyway (it skips only after checking a mask's values, which export cannot do). That mask is sized for the
    input: encoders that shorten their sequence between layers (Informer's and Autoformer's distilling
    convolutions) then meet a mask of the wrong size. With nothing to check, the export skips it like eager."""

    def ignore(padding_mask, kv_length, local_attention_size=None):
        # a local window skipped only where the length is known to fit it: asked of a symbolic length, the answer
        # bounded the program (ModernBERT's refused sequences past its window)
        fits = local_attention_size is None or statically_known_true(kv_length < local_attention_size)
        if padding_mask is None and fits:
            report_applied()
            return True
        return original(padding_mask, kv_length, local_attention_size)

    return ignore


# Vision towers that pack several images into one sequence (Qwen-VL style, `cu_seqlens` marks where each image
# starts) attend image by image: `torch.split(q, lengths.tolist())`, sizes read from tensor values, which torch.export
# cannot trace. Their flash-attention branch hands `cu_seqlens` to the attention function instead, so for the trace
# those configs name a registered "flash" function that builds the block-diagonal mask and runs one SDPA.

SEGMENTED_ATTENTION = "flash_segments_as_mask"
SEGMENTED_ATTENTION_SWITCH = register_switch(
    "dynamo", "segmented_attention",
    "Vision towers that pack several images into one sequence attend through one masked SDPA over their `cu_seqlens`",
    "model-patches",
    model_side="Packed vision towers (Qwen2-VL and its kin) build one block-diagonal mask from `cu_seqlens` with "
               "tensor ops for SDPA instead of splitting the sequence per image in Python.",
)


def _segmented_sdpa(module, query, key, value, attention_mask=None, cu_seq_lens_q=None, **kwargs):
    """SDPA restricted to the segments of ``cu_seq_lens_q``: the same numbers as one SDPA per segment."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    for name in ("cu_seq_lens_k", "max_length_q", "max_length_k"):
        kwargs.pop(name, None)
    if cu_seq_lens_q is None:  # called without boundaries (ColQwen2's text layers): one segment per sample
        return sdpa_attention_forward(module, query, key, value, attention_mask=attention_mask, **kwargs)
    positions = torch.arange(query.shape[-2], device=query.device)
    # boundaries passed, counted against all of them: slicing off the first and last would slice a length the
    # trace does not know, which ExecuTorch's slice decomposition guards on
    segment = (positions[:, None] >= cu_seq_lens_q[None, :]).sum(-1)
    mask = (segment[:, None] == segment[None, :])[None, None]
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            mask = mask & attention_mask
        else:
            mask = torch.where(mask, attention_mask, torch.finfo(query.dtype).min)
    # torch's SDPA itself: transformers' wrapper decides causality on `query length > 1` first, a guard on the
    # packed length, which is data-dependent (MiniCPM-V's merger); with a mask there is nothing to decide
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=kwargs.get("dropout", 0.0), scale=kwargs.get("scaling")
    )
    return output.transpose(1, 2).contiguous(), None


@contextmanager
def segmented_attention(model: torch.nn.Module, fired: set[str]):
    """Point the config of every attention module that takes ``cu_seqlens`` at `_segmented_sdpa` for the trace."""
    from transformers import AttentionInterface, PreTrainedConfig
    from transformers.utils.generic import is_flash_attention_requested

    configs = {
        id(module.config): module.config
        for module in model.modules()
        if isinstance(getattr(module, "config", None), PreTrainedConfig)
        and "cu_seqlens" in inspect.signature(module.forward).parameters
        and not is_flash_attention_requested(module.config)
    }
    saved = {key: config._attn_implementation for key, config in configs.items()}
    if configs:
        AttentionInterface.register(SEGMENTED_ATTENTION, _segmented_sdpa)
        fired.add(SEGMENTED_ATTENTION_SWITCH)
    try:
        for config in configs.values():
            config._attn_implementation = SEGMENTED_ATTENTION
        yield
    finally:
        for key, config in configs.items():
            config._attn_implementation = saved[key]
