"""Stage 2 model patches: image tokens laid into the text: Ovis2's visual indicators, Llama 4's vision rotary, ViLT's
patches; and, in registration order, Qwen4-Exp's sparse-attention indexer.
"""

from __future__ import annotations

import importlib
import math

import torch

from ...registration import register_patch
from .rotary import rotate_pairs


# ── Stage 2: Model patches ───────────────────────────────────────────────────


@register_patch(
    "dynamo", "transformers.models.ovis2.modeling_ovis2.Ovis2Model.forward",
    model_side="Ovis2Model.forward writes its visual-indicator embeddings with torch.where over the token mask "
               "instead of under a Python `if mask.any()` branch.",
)
def _patch_ovis2_visual_indicators_by_where(original):
    """Ovis2 writes its visual indicator features into the embeddings under `if mask.any()`, a branch on token
    values. The same rows chosen by `torch.where` before the forward, which then runs on those embeddings with no
    indicator ids left to look for."""

    def forward(self, input_ids=None, pixel_values=None, *args, mm_encoder_outputs=None, **kwargs):
        precomputed = mm_encoder_outputs is not None or kwargs.get("inputs_embeds") is not None
        if input_ids is None or pixel_values is None or precomputed or args:
            return original(self, input_ids, pixel_values, *args, mm_encoder_outputs=mm_encoder_outputs, **kwargs)
        kwargs.pop("inputs_embeds", None)
        image = self.get_image_features(pixel_values=pixel_values, return_dict=True)
        embeds = self.get_input_embeddings()(input_ids)
        for index, token_id in enumerate(self.visual_indicator_token_ids):
            feature = image.visual_indicator_features[index].to(embeds.dtype)
            embeds = torch.where((input_ids == token_id)[..., None], feature, embeds)
        indicator_ids, self.visual_indicator_token_ids = self.visual_indicator_token_ids, []
        try:
            return original(self, None, None, inputs_embeds=embeds, mm_encoder_outputs={"image": image}, **kwargs)
        finally:
            self.visual_indicator_token_ids = indicator_ids

    return forward


@register_patch(
    "dynamo", "transformers.models.llama4.modeling_llama4.Llama4VisionRotaryEmbedding.forward",
    model_side="Llama4VisionRotaryEmbedding stores its 2-D rotary table as real (cos, sin) pairs instead of a "
               "complex (view_as_complex) buffer.",
)
def _patch_llama4_vision_rotary_as_pairs(_original):
    """Llama 4's vision tower keeps its 2-D rotary table as a complex buffer. The same table as real (cos, sin)
    pairs: patch columns then rows, counted from 1, and no rotation for the class token appended last."""

    def forward(self, hidden_states):
        config = self.config
        side = config.image_size // config.patch_size
        half = config.hidden_size // config.num_attention_heads // 2
        inv_freq = 1.0 / config.rope_parameters["rope_theta"] ** (torch.arange(0, half, 2)[: half // 2].float() / half)
        patch = torch.arange(side * side, device=hidden_states.device)
        grid = torch.stack((patch % side, patch // side), dim=-1) + 1
        angles = (grid[..., None].float() * inv_freq.to(hidden_states.device)).flatten(-2)
        angles = torch.cat([angles, angles.new_zeros(1, angles.shape[-1])])
        return torch.stack((angles.cos(), angles.sin()), dim=-1)[:, None]

    return forward


@register_patch(
    "dynamo", "transformers.models.llama4.modeling_llama4.vision_apply_rotary_emb",
    model_side="transformers' llama4 vision_apply_rotary_emb rotates query/key pairs with real cos/sin "
               "arithmetic instead of view_as_complex / complex multiply / view_as_real.",
)
def _patch_llama4_vision_rotate_pairs(original):
    """The rotation half of `_patch_llama4_vision_rotary_as_pairs`: (batch, patches, heads, dim) queries."""

    def vision_apply_rotary_emb(query, key, freqs_ci):
        if freqs_ci.is_complex():  # the table's half is not installed
            return original(query, key, freqs_ci)
        table = freqs_ci.reshape(1, query.shape[1], 1, -1, 2)
        return rotate_pairs(query, table), rotate_pairs(key, table)

    return vision_apply_rotary_emb


@register_patch(
    "dynamo", "transformers.models.vilt.modeling_vilt.ViltEmbeddings.visual_embed",
    model_side="ViltEmbeddings.visual_embed keeps all patches in place with a padding mask and resizes positions"
               " with a batched grid_sample when every patch is kept, instead of sampling patch order with "
               "multinomial and resizing the position table per image from extents read off the pixel mask.",
)
def _patch_vilt_patches_in_place(original):
    """ViLT gathers each image's patches in an order drawn at random (`multinomial`), pads short images with
    patches drawn from their padding, and resizes its position table to each image's extent read from the pixel
    mask: shapes from data, and random. Attention masks the padding and every patch carries its own position, so
    keeping all patches in place, the padding masked, gives eager's text and pooled states. Where the config keeps
    fewer patches than an image has, eager's subset is random: left to eager's code."""

    def visual_embed(self, pixel_values, pixel_mask, max_image_length=200):
        patches = self.patch_embeddings(pixel_values)
        batch_size, channels, height, width = patches.shape
        if isinstance(max_image_length, int) and 0 <= max_image_length < height * width:
            return original(self, pixel_values, pixel_mask, max_image_length)
        mask = torch.nn.functional.interpolate(pixel_mask[:, None].float(), size=(height, width)).long()[:, 0]
        rows, columns = mask.sum(dim=1)[:, 0], mask.sum(dim=2)[:, 0]
        side = self.config.image_size // self.config.patch_size
        table = self.position_embeddings[:, 1:].transpose(1, 2).reshape(1, channels, side, side)

        def grid_axis(count, length):  # `interpolate(align_corners=True)` to `count` places, in [-1, 1]
            places = torch.arange(length, device=patches.device)
            return places[None] * (2 / (count - 1).clamp(min=1))[:, None] - 1, places[None] < count[:, None]

        y, y_inside = grid_axis(rows, height)
        x, x_inside = grid_axis(columns, width)
        grid = torch.stack(torch.broadcast_tensors(x[:, None, :], y[:, :, None]), dim=-1)
        positions = torch.nn.functional.grid_sample(
            table.expand(batch_size, -1, -1, -1), grid.to(table.dtype), mode="bilinear", align_corners=True
        )
        positions = positions * (y_inside[:, :, None] & x_inside[:, None, :])[:, None]  # zero past each image
        patch_index = torch.stack(
            torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij"), dim=-1
        ).to(mask.device)
        embeddings = torch.cat((self.cls_token.expand(batch_size, -1, -1), patches.flatten(2).transpose(1, 2)), 1)
        first = self.position_embeddings[:, :1].expand(batch_size, -1, -1)
        embeddings = embeddings + torch.cat((first, positions.flatten(2).transpose(1, 2)), dim=1)
        mask = torch.cat((mask.new_ones(batch_size, 1), mask.flatten(1)), dim=1)
        return self.dropout(embeddings), mask, (patch_index.view(1, -1, 2).expand(batch_size, -1, -1), (height, width))

    return visual_embed


@register_patch(
    "dynamo", "transformers.models.qwen4_exp.modeling_qwen4_exp.Qwen4ExpTextQSAIndexer.forward",
    model_side="Qwen4ExpTextQSAIndexer.forward selects blocks with fixed-size masks over all keys (rank among "
               "visible keys -> block id, -inf for unfillable blocks, topk, scatter) instead of looping over "
               "rows and queries with nonzero().",
)
def _patch_qwen4_indexer_by_masks(original):
    """Qwen4-Exp's sparse-attention indexer loops over every row and query, lists the keys a query sees with
    `nonzero`, pools them into blocks of `compress_ratio` in that order, and keeps the best-scoring blocks and the
    incomplete tail: sizes read from data. The same selection over every key at once: a key's rank among the
    visible ones names its block, blocks a query cannot fill score -inf, and the best are scattered back. Between
    blocks that tie (a query whose scores are all zero, as a padding token's) topk picks by its own order, in eager
    as here, and that order depends on the vector's length."""
    rotate = importlib.import_module(original.__module__).apply_rotary_pos_emb

    def forward(self, hidden_states, position_embeddings, attention_mask, past_key_values):
        batch_size, seq_length, _ = hidden_states.shape
        full_cos, full_sin = position_embeddings
        queries, keys = torch.split(
            self.index_qk_proj(hidden_states),
            [self.index_n_heads * self.index_head_dim, self.index_kv_heads * self.index_head_dim], dim=-1,
        )
        queries = self.q_layernorm(queries.reshape(batch_size, seq_length, -1, self.index_head_dim))
        queries = rotate(queries, cos=full_cos[:, -seq_length:], sin=full_sin[:, -seq_length:], unsqueeze_dim=2)
        keys = keys.reshape(batch_size, seq_length, -1, self.index_head_dim).squeeze(2)
        if past_key_values is not None:
            keys = past_key_values.update_indexer(keys, self.layer_idx)

        visible = (attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0)[:, 0]
        # sym_max and a comparison, not max() and one_hot(): both would fix the block count at its traced value
        ratio, most = self.compress_ratio, torch.sym_max(visible.shape[-1] // self.compress_ratio, 1)
        rank = visible.long().cumsum(-1) - 1  # among the keys the query sees, in order
        filled = visible.sum(-1, keepdim=True) // ratio  # complete blocks per query
        pooled = visible & (rank < filled * ratio)
        block = torch.where(pooled, rank // ratio, most)
        blocks = torch.arange(most, device=block.device)
        member = (block[..., None] == blocks).float()  # (batch, query, key, block)
        block_keys = self.k_layernorm((torch.einsum("bqkm,bkd->bqmd", member, keys.float()) / ratio).to(keys.dtype))
        first = member * (rank % ratio == 0)[..., None]  # each block rotated by its first key's position
        cos, sin = (torch.einsum("bqkm,bkd->bqmd", first, table.float()).to(table.dtype)
                    for table in (full_cos, full_sin))
        block_keys = rotate(block_keys.unsqueeze(3), cos=cos, sin=sin, unsqueeze_dim=3).squeeze(3)
        scores = torch.einsum("bqhd,bqmd->bqmh", queries.float(), block_keys.float()).relu().sum(-1)
        scores = scores / math.sqrt(self.index_head_dim)
        fillable = blocks < filled
        kept_count = torch.sym_min(self.block_topk, most)
        best = scores.masked_fill(~fillable, float("-inf")).topk(kept_count, dim=-1).indices
        chosen = torch.zeros_like(fillable).scatter(-1, best, fillable.gather(-1, best))
        kept = chosen.gather(-1, block.clamp(max=most - 1)) & pooled
        return (kept | (visible & ~pooled)).unsqueeze(1)

    return forward
