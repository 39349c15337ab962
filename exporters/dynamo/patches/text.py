"""Stage 2 model patches: long-text models: Longformer's and LED's global attention and padding, Reformer's axial
positions, padding and hashing, Funnel's positions.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch

from ...registration import register_patch


# ── Stage 2: Model patches ───────────────────────────────────────────────────


@register_patch(
    "dynamo",
    "transformers.models.longformer.modeling_longformer.LongformerSelfAttention.forward",
    "transformers.models.led.modeling_led.LEDEncoderSelfAttention.forward",
    model_side="LongformerSelfAttention.forward (and LEDEncoderSelfAttention.forward) compute global attention "
               "with fixed-size masks over the whole sequence instead of gathering global tokens with nonzero() "
               "and branching on `is_index_global_attn.flatten().any().item()`.",
)
def _patch_longformer_attention_dense(original):
    """Longformer (and LED's encoder) gathers its global tokens with `nonzero()` into a list as long as the most
    global tokens in the batch, and takes that path on `any().item()`: sizes and a branch read from tensor values.
    The same attention written densely over the whole sequence, with masks where the original gathers: a local query
    sees its window (`|i - j| <= w`, neither padding nor global keys there) and every global key once, by its own
    projections; a global query sees every unpadded key by the global projections. Without global tokens the
    global terms are masked out, so one trace serves both branches."""

    def forward(self, hidden_states, attention_mask=None, is_index_masked=None, is_index_global_attn=None,
                is_global_attn=None, output_attentions=False):
        if output_attentions:  # the attention maps in the original's banded layout
            return original(self, hidden_states, attention_mask, is_index_masked, is_index_global_attn,
                            is_global_attn, output_attentions)
        batch, length, _ = hidden_states.shape
        lowest = torch.finfo(hidden_states.dtype).min

        def heads(vectors):  # (batch, heads, length, head_dim)
            return vectors.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)

        def attend(query, key, value, allowed):
            scores = torch.matmul(query / math.sqrt(self.head_dim), key.transpose(-1, -2))
            scores = scores.masked_fill(~allowed, lowest)
            probabilities = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
            return torch.matmul(probabilities, value)

        positions = torch.arange(length, device=hidden_states.device)
        in_window = (positions[:, None] - positions[None, :]).abs() <= self.one_sided_attn_window_size
        is_global = is_index_global_attn[:, None, None, :]
        local_key = (attention_mask == 0)[:, None, None, :]
        local = attend(heads(self.query(hidden_states)), heads(self.key(hidden_states)),
                       heads(self.value(hidden_states)), (in_window & local_key) | is_global)
        unpadded = ~is_index_masked[:, None, None, :]
        global_ = attend(heads(self.query_global(hidden_states)), heads(self.key_global(hidden_states)),
                         heads(self.value_global(hidden_states)), unpadded.expand(-1, -1, length, -1))
        output = torch.where(is_index_global_attn[:, None, :, None], global_, local)
        output = output.masked_fill(is_index_masked[:, None, :, None], 0.0)  # padding queries: zeros, as the original
        return (output.transpose(1, 2).reshape(batch, length, self.embed_dim),)

    return forward


@contextmanager
def _seeded_rotations(seed):
    """With a hash seed, Reformer seeds the global generator (`torch.manual_seed`) before drawing its rotations: a
    side effect a trace does not record, so the program would draw new ones each run. The seeded draw, made while
    tracing, is a constant of the program instead."""
    if seed is None:
        yield
        return
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

    draw = torch.randn

    def seeded_draw(*shape, **kwargs):
        with unset_fake_temporarily(), disable_proxy_modes_tracing():
            return draw(*shape, generator=torch.Generator().manual_seed(seed), **kwargs)

    torch.randn = seeded_draw
    try:
        yield
    finally:
        torch.randn = draw


@register_patch(
    "dynamo", "transformers.models.reformer.modeling_reformer.AxialPositionEmbeddings.forward",
    model_side="Reformer's AxialPositionEmbeddings.forward looks up positions with one gather from the full "
               "axial table instead of cutting it to `max(position_ids).item()` rows and looping over the batch "
               "in Python.",
)
def _patch_reformer_axial_positions_gathered(original):
    """At inference Reformer cuts its axial table to the rows its largest position id needs (`.item()`), then looks
    up each sample's positions in a Python loop over the batch, which fixed the batch. The rows cut away are never
    looked up: one gather from the whole table is the same."""

    def forward(self, position_ids):
        if self.training:
            return original(self, position_ids)
        rows, columns = self.axial_pos_shape
        table = torch.cat([weight.expand(rows, columns, weight.shape[-1]) for weight in self.weights], dim=-1)
        return table.reshape(rows * columns, -1)[position_ids]

    return forward


def _padded_along_sequence(tensor, padded_length, filler):
    """``tensor`` (batch, length, ...) padded with ``filler`` to ``padded_length``: written over a filled tensor, so
    that no tensor is as long as the padding alone, whose length of 1 the trace would guard on."""
    result = filler.expand(tensor.shape[0], padded_length, *tensor.shape[2:]).clone()
    result[:, : tensor.shape[1]] = tensor
    return result


@register_patch(
    "dynamo", "transformers.models.led.modeling_led.LEDEncoder._pad_to_window_size",
    model_side="LEDEncoder._pad_to_window_size always pads (by 1..window tokens, or computes the pad amount "
               "without a Python `if padding_len > 0` branch) so the traced graph does not specialize on the "
               "sequence length's remainder.",
)
def _patch_led_pads_at_least_one_token(original):
    """LED pads its input to a multiple of the attention window only when it is not one (`if padding_len > 0`, and
    unpads likewise): on a dynamic length the trace keeps one branch and guards on the length's remainder. Padding
    by 1 to `window` tokens instead (a whole masked window when the length is a multiple) takes one branch for
    every length; padded tokens are masked keys and are cut from the output, so the real tokens see the same."""

    def _pad_to_window_size(self, input_ids, attention_mask, inputs_embeds, pad_token_id):
        window = self.config.attention_window
        window = window if isinstance(window, int) else max(window)
        length = (input_ids if input_ids is not None else inputs_embeds).shape[1]
        padded_length = (length // window + 1) * window
        if input_ids is not None:
            input_ids = _padded_along_sequence(input_ids, padded_length, input_ids.new_tensor(pad_token_id))
        if inputs_embeds is not None:
            pad_embedding = self.embed_tokens(torch.tensor(self.config.pad_token_id, device=inputs_embeds.device))
            inputs_embeds = _padded_along_sequence(inputs_embeds, padded_length, pad_embedding.to(inputs_embeds.dtype))
        attention_mask = _padded_along_sequence(attention_mask, padded_length, attention_mask.new_tensor(False))
        return padded_length - length, input_ids, attention_mask, inputs_embeds

    return _pad_to_window_size


@register_patch(
    "dynamo", "transformers.models.reformer.modeling_reformer.ReformerModel._pad_to_mult_of_chunk_length",
    model_side="ReformerModel._pad_to_mult_of_chunk_length builds its padding with nn.functional.pad (a size "
               "computed symbolically from the length) instead of concatenating a freshly created tensor whose "
               "traced length gets fixed.",
)
def _patch_reformer_padding_written_over(original):
    """Reformer pads its tokens to a multiple of its chunk length by concatenating a tensor as long as the padding,
    whose length of 1 the trace fixed (and with it the length's remainder)."""

    def _pad_to_mult_of_chunk_length(self, input_ids, inputs_embeds=None, attention_mask=None, position_ids=None,
                                     input_shape=None, padding_length=None, padded_seq_length=None, device=None):
        if position_ids is not None:
            return original(self, input_ids, inputs_embeds, attention_mask, position_ids, input_shape, padding_length,
                            padded_seq_length, device)
        length = input_shape[-1]
        padded_length = length + padding_length
        if attention_mask is None:
            attention_mask = torch.ones(input_shape, device=device, dtype=torch.bool)
        attention_mask = _padded_along_sequence(attention_mask, padded_length, attention_mask.new_tensor(0))
        if input_ids is not None:
            input_ids = _padded_along_sequence(input_ids, padded_length, input_ids.new_tensor(self.config.pad_token_id))
            input_shape = input_ids.size()
        if inputs_embeds is not None:
            pad_embedding = self.get_input_embeddings()(torch.tensor(self.config.pad_token_id, device=device))
            inputs_embeds = _padded_along_sequence(inputs_embeds, padded_length, pad_embedding)
            input_shape = inputs_embeds.size()[:-1]
        return input_ids, inputs_embeds, attention_mask, position_ids, input_shape

    return _pad_to_mult_of_chunk_length


@register_patch(
    "dynamo", "transformers.models.reformer.modeling_reformer.LSHSelfAttention._hash_vectors",
    model_side="LSHSelfAttention._hash_vectors always assigns padding tokens to an extra bucket with tensor ops "
               "(torch.where on the mask) instead of branching on `attention_mask.sum().item()`.",
)
def _patch_reformer_padding_bucket_as_tensors(original):
    """Reformer's LSH attention adds a bucket for padding tokens when `attention_mask.sum().item()` shows padding, a
    branch on tensor values. Both branches in tensor arithmetic: the buckets hashed without the mask, padding tokens
    moved to the extra bucket, and each hashing round offset by the bucket count its branch would have used."""

    def _hash_vectors(self, vectors, num_hashes, attention_mask, increase_num_buckets=False):
        if attention_mask is None:
            return original(self, vectors, num_hashes, attention_mask, increase_num_buckets)
        batch, length = attention_mask.shape
        num_buckets = self.num_buckets if isinstance(self.num_buckets, int) else math.prod(self.num_buckets)
        rounds = torch.arange(num_hashes, device=vectors.device).view(1, 1, -1, 1)
        with _seeded_rotations(self.hash_seed):
            hashed = original(self, vectors, num_hashes, None)
        hashed = hashed.view(batch, self.num_attention_heads, num_hashes, length)
        real = attention_mask.to(torch.bool)[:, None, None, :]
        buckets = torch.where(real, hashed - rounds * num_buckets, num_buckets)
        padded = (~real).any() if not increase_num_buckets else torch.tensor(True, device=vectors.device)
        return (buckets + rounds * (num_buckets + padded.long())).flatten(start_dim=2, end_dim=3)

    return _hash_vectors


@register_patch(
    "dynamo", "transformers.models.funnel.modeling_funnel.FunnelAttentionStructure.get_position_embeds",
    model_side="FunnelAttentionStructure.get_position_embeds derives its relative distances from symbolic "
               "first/last positions and counts instead of materialising `list(range(seq_len))` in Python and "
               "pooling it block by block.",
)
def _patch_funnel_positions_by_their_ends(original):
    """Funnel's relative-shift attention lists every token position in Python (`list(range(seq_len))`) and pools
    the list block by block, which fixes the sequence length in the trace. Its relative distances read only the
    first and last positions and the count of each list: those, kept as numbers, give the same distances for any
    length. A list is (first, second, step, count): its first position, then an arithmetic run from the second."""

    def get_position_embeds(self, seq_len, dtype, device):
        if self.config.attention_type == "factorized":
            return original(self, seq_len, dtype, device)
        d_model = self.config.d_model
        inv_freq = 1 / (10000 ** (torch.arange(0, d_model // 2, dtype=torch.int64, device=device).to(dtype)
                                  / (d_model // 2)))
        zero_offset = seq_len * 2
        relative = torch.arange(-seq_len * 2, seq_len * 2, dtype=torch.int64, device=device).to(dtype)
        sinusoid = relative[:, None] * inv_freq[None]
        pos_embed = torch.cat([self.sin_dropout(torch.sin(sinusoid)), self.cos_dropout(torch.cos(sinusoid))], dim=-1)

        def last(positions):
            first, second, step, count = positions
            return first if count == 1 else second + (count - 2) * step

        def pooled(positions, block_index):  # `stride_pool_pos`
            first, second, step, count = positions
            if not self.config.separate_cls:
                return first, first + 2 * step, 2 * step, (count + 1) // 2
            kept = count - 2 if self.config.truncate_seq else count - 1
            return 1 - 2**block_index, second, 2 * step, 1 + (kept + 1) // 2

        def distances(positions, stride, pooled_positions, shift):  # `relative_pos`
            top = pooled_positions[0] - positions[0] + shift * pooled_positions[3] * stride
            bottom = pooled_positions[0] - last(positions)
            rows = torch.arange(top, bottom - 1, -stride, dtype=torch.long, device=device)
            return torch.gather(pos_embed, 0, (rows[:, None] + zero_offset).expand(rows.size(0), d_model))

        positions = (0, 1, 1, seq_len)
        embeds = []
        for block_index in range(self.config.num_blocks):
            between = None
            if block_index > 0:
                pooled_positions = pooled(positions, block_index)
                between = distances(positions, 2 ** (block_index - 1), pooled_positions, shift=2)
                positions = pooled_positions
            embeds.append([distances(positions, 2**block_index, positions, shift=1), between])
        return embeds

    return get_position_embeds
