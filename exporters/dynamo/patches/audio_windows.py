"""Stage 2 model patches: audio windows and chunks: the Qwen audio towers, the Qwen Omni thinkers, Phi-4's streaming
mask; and, in registration order, SLANet's table decode, SAM 3's box bias and CANINE's local attention.
"""

from __future__ import annotations

import importlib
import inspect

import torch

from ...registration import register_patch, report_applied
from .grids import part_starts, places_in_parts


# ── Stage 2: Model patches ───────────────────────────────────────────────────


@register_patch(
    "dynamo",
    "transformers.models.slanet.modeling_slanet.SLANetSLAHead.forward",
    "transformers.models.slanext.modeling_slanext.SLANeXtSLAHead.forward",
    model_side="SLANetSLAHead.forward / SLANeXtSLAHead.forward decode a fixed number of steps (or use a tensor "
               "condition) and cut the output after the first step where every row ended, instead of a Python "
               "`break` on `...eq(end).any(-1).all()`.",
)
def _patch_table_decode_cut_after(original):
    """SLANet's table-structure head decodes greedily and stops once every row has emitted its end token: a
    Python `break` on tensor values. Each step reads only earlier ones, so every step is decoded and the output
    cut after the first at which every row has ended: a length read from data, bounded by the step count. The
    per-step states (`hidden_states`) are not returned."""
    from transformers.modeling_outputs import BaseModelOutput

    def forward(self, hidden_states, targets=None, **kwargs):
        config, batch = self.config, hidden_states.shape[0]
        features = hidden_states.new_zeros(batch, config.hidden_size, dtype=torch.float32)
        predicted = torch.zeros(batch, dtype=torch.long, device=hidden_states.device)
        steps, predictions = config.max_text_length + 1, []
        for _ in range(steps):
            embedded = torch.nn.functional.one_hot(predicted, config.out_channels).float()
            features, _ = self.structure_attention_cell(features, hidden_states.float(), embedded)
            step = self.structure_generator(features)
            predicted = step.argmax(dim=1)
            predictions.append((step, predicted))
        ends = torch.stack([ids for _, ids in predictions], dim=1).eq(config.out_channels - 1)
        every_row = (ends.long().cumsum(dim=1) > 0).all(dim=0)  # every row has ended by this step
        length = torch.where(every_row.any(), every_row.int().argmax() + 1, steps).item()
        torch._check(length >= 1)
        torch._check(length <= steps)
        structure = torch.stack([step for step, _ in predictions], dim=1)[:, :length]
        structure = torch.nn.functional.softmax(structure, dim=-1, dtype=torch.float32).to(hidden_states.dtype)
        return BaseModelOutput(last_hidden_state=structure)

    return forward


@register_patch(
    "dynamo",
    "transformers.models.qwen3_asr.modeling_qwen3_asr.get_audio_cu_seqlens",
    "transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe.get_audio_cu_seqlens",
    model_side="transformers' get_audio_cu_seqlens (qwen3_asr, qwen3_omni_moe) builds a fixed number of "
               "attention windows per sample (one per chunk, empty ones repeating the boundary) with tensor ops "
               "instead of a Python loop over lengths read from the mask.",
)
def _patch_audio_windows_padded(original):
    """The Qwen audio towers cut each sample's frames into attention windows in a Python loop over lengths read
    from the mask: as many boundaries as the data makes. A window as long as the longest chunk's frames times the
    inference ratio, so a sample has at most one window per chunk of the batch: that many per sample, the ones past
    its frames empty. Empty windows add repeated boundaries, which split no window."""
    lengths_after_convolution = importlib.import_module(original.__module__)._get_feat_extract_output_lengths

    def get_audio_cu_seqlens(chunk_lengths, feature_lens, n_window_infer, n_window, kwargs=None):
        if kwargs is not None and (cu_seqlens := kwargs.pop("cu_seqlens", None)) is not None:
            return cu_seqlens
        lengths = lengths_after_convolution(feature_lens, n_window)
        window = lengths_after_convolution(chunk_lengths, n_window).max() * (n_window_infer // (n_window * 2))
        starts = torch.arange(chunk_lengths.shape[0], device=lengths.device) * window
        sizes = (lengths[:, None] - starts[None]).clamp(min=0).minimum(window)
        return torch.nn.functional.pad(sizes.flatten().cumsum(-1), (1, 0)).to(torch.int32)

    return get_audio_cu_seqlens


def _audio_chunks_on_a_grid(input_features, feature_attention_mask, chunk_width):
    """Each sample's kept frames, in order, cut into chunks of `chunk_width` on a grid of as many chunks per sample
    as the padded frames make: `(samples * chunks, bins, chunk_width)`, zeros past a sample's frames, and each
    chunk's frame count (0 for a chunk past them)."""
    samples, bins, frames = input_features.shape
    chunks = (frames + chunk_width - 1) // chunk_width
    kept = feature_attention_mask != 0
    # a kept frame's place among its sample's kept frames; dropped frames go to one spare column, cut after
    place = torch.where(kept, kept.long().cumsum(1) - 1, chunks * chunk_width)
    grid = input_features.new_zeros(samples, bins, chunks * chunk_width + 1)
    grid = grid.scatter(2, place[:, None, :].expand(-1, bins, -1), input_features)[..., :-1]
    grid = grid.view(samples, bins, chunks, chunk_width).transpose(1, 2).reshape(-1, bins, chunk_width)
    chunk_starts = torch.arange(chunks, device=kept.device) * chunk_width
    chunk_lengths = (kept.sum(1)[:, None] - chunk_starts).clamp(0, chunk_width).flatten()
    return grid, chunk_lengths


@register_patch(
    "dynamo",
    "transformers.models.qwen2_5_omni.modeling_qwen2_5_omni.Qwen2_5OmniThinkerModel.get_audio_features",
    "transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe.Qwen3OmniMoeThinkerModel.get_audio_features",
    reports=True,
    model_side="Qwen2_5OmniThinkerModel.get_audio_features / Qwen3OmniMoeThinkerModel.get_audio_features lay the"
               " audio chunks on a fixed per-sample grid derived from the padded frame count instead of "
               "splitting the kept frames by `.tolist()` sizes (and grouping chunks for the convolution in "
               "Python).",
)
def _patch_omni_audio_chunks_on_a_grid(original):
    """The Qwen Omni thinkers gather every kept audio frame into one row and split it into chunks by sizes read
    with `.tolist()`: the chunk count is data, and Qwen3-Omni's convolution then walks those chunks in groups. Its
    audio tower takes the chunks precomputed: laid on a grid of as many per sample as the padded frames make
    (`_audio_chunks_on_a_grid`), a chunk past a sample's frames holds none, adds no valid position and an empty
    attention window. The valid positions are then counted on the grid's width, not the longest chunk's."""
    from transformers.utils.generic import accepts_precomputed_kwargs, can_return_tuple

    module = importlib.import_module(original.__module__)
    qwen3 = original.__module__.endswith(".modeling_qwen3_omni_moe")
    convolutions = 3 if qwen3 else 1  # of stride 2, over each chunk

    def lengths_after_convolution(lengths, n_window):
        if qwen3:
            return module._get_feat_extract_output_lengths(lengths, n_window)
        return (lengths - 1) // 2 + 1

    def get_audio_features(self, input_features, feature_attention_mask=None, audio_feature_lengths=None, **kwargs):
        if feature_attention_mask is None or "padded_feature" in kwargs:
            return inspect.unwrap(original)(self, input_features, feature_attention_mask, audio_feature_lengths,
                                            **kwargs)
        report_applied()
        n_window = self.audio_tower.n_window
        chunk_width = 2 * n_window
        padded_feature, chunk_lengths = _audio_chunks_on_a_grid(input_features, feature_attention_mask, chunk_width)
        width = chunk_width  # not Qwen3's length formula: it counts 13 per whole chunk whatever the window
        for _ in range(convolutions):
            width = (width - 1) // 2 + 1
        positions = torch.arange(width, device=chunk_lengths.device)
        valid = positions < lengths_after_convolution(chunk_lengths, n_window)[:, None]
        feature_lens = feature_attention_mask.sum(1)
        if not qwen3:  # Qwen2.5-Omni averages each sample's positions in pairs; eager slices `[:-1]` of the batch
            def pairs_of(frames):
                return (lengths_after_convolution(frames, n_window) - 2) // 2 + 1

            pairs = pairs_of(feature_lens)
            total = pairs.sum().item()
            # at most every sample's frames kept: a bound ExecuTorch can plan memory for
            samples, frames = feature_attention_mask.shape
            torch._check(total <= samples * pairs_of(frames))
            sample_positions = lengths_after_convolution(feature_lens, n_window)
            sample, pair = places_in_parts(pairs, total)
            kwargs["pool_indices"] = part_starts(sample_positions)[sample] + 2 * pair
        return self.audio_tower(
            None, feature_lens=feature_lens, padded_feature=padded_feature, chunk_lengths=chunk_lengths,
            valid_indices=valid.flatten().nonzero().squeeze(-1), return_dict=True, **kwargs)

    return accepts_precomputed_kwargs(modality="audio")(can_return_tuple(get_audio_features))


@register_patch(
    "dynamo",
    "transformers.models.sam3.modeling_sam3.Sam3DetrDecoder.forward",
    "transformers.models.sam3_lite_text.modeling_sam3_lite_text.Sam3LiteTextDetrDecoder.forward",
    reports=True,
    model_side="Sam3DetrDecoder.forward (and Sam3LiteTextDetrDecoder.forward) reads the token grid's height and "
               "width once (as Python ints or a spatial_shapes_list, as other DETR models in transformers do) "
               "and passes them as sizes to the box-bias computation instead of reading them back from the "
               "spatial_shapes tensor in every layer.",
)
def _patch_sam3_box_bias_on_the_token_grid(original):
    """SAM 3's DETR decoder lays each query's box bias over the vision tokens on a grid whose height and width it
    reads back from the `spatial_shapes` tensor, once per layer: values read from data, whose product the trace
    cannot match to the token count the bias is added to. Read once, checked against that count, and handed to
    the bias as sizes."""

    def forward(self, vision_features, *args, spatial_shapes=None, **kwargs):
        if not isinstance(spatial_shapes, torch.Tensor) or spatial_shapes.shape[0] != 1:
            return original(self, vision_features, *args, spatial_shapes=spatial_shapes, **kwargs)
        report_applied()
        height, width = spatial_shapes[0].tolist()
        torch._check(height * width == vision_features.shape[1])
        for side in (height, width):  # bounds ExecuTorch plans the bias for
            torch._check(side >= 1)
            torch._check(side <= vision_features.shape[1])
        box_bias = type(self)._get_rpb_matrix
        self._get_rpb_matrix = lambda boxes, _grid: box_bias(self, boxes, (height, width))
        try:
            return original(self, vision_features, *args, spatial_shapes=spatial_shapes, **kwargs)
        finally:
            del self._get_rpb_matrix

    return forward


_PHI4_AUDIO = "transformers.models.phi4_multimodal.modeling_phi4_multimodal"


@register_patch(
    "dynamo", f"{_PHI4_AUDIO}.adaptive_enc_mask", f"{_PHI4_AUDIO}.Phi4MultimodalAudioModel._streaming_mask",
    model_side="transformers' phi4_multimodal adaptive_enc_mask / Phi4MultimodalAudioModel._streaming_mask build"
               " the chunk mask with torch ops (torch.arange, argmax of the frame-by-chunk table) instead of "
               "np.arange and nonzero().",
)
def _patch_streaming_mask_by_argmax(original):
    """Phi-4's audio conformer finds each frame's chunk with `nonzero()` over a frame-by-chunk table in which every
    row holds exactly one True: a count the trace cannot know. The first True of each row is the same chunk. The
    chunk starts come from `np.arange` over the frame count, which a symbolic count cannot feed: `torch.arange`."""

    def adaptive_enc_mask(x_len, chunk_start_idx, left_window=0, right_window=0):
        starts = torch.as_tensor(chunk_start_idx).long()
        start_pad = torch.nn.functional.pad(starts, (1, 0))
        end_pad = torch.cat([starts, starts.new_ones(1) * x_len])  # pad's value= would fix a symbolic x_len
        frames = torch.arange(0, x_len)
        chunk = ((frames[:, None] < end_pad) & (frames[:, None] >= start_pad)).int().argmax(dim=-1)
        left = start_pad[(chunk - left_window).clamp(min=0)]
        right = end_pad[(chunk + right_window).clamp(max=starts.shape[0])]
        return (frames[None] >= left[:, None]) & (frames[None] < right[:, None])

    def _streaming_mask(self, seq_len, batch_size, chunk_size, left_chunk):
        if self.training:  # chunks drawn at random
            return original(self, seq_len, batch_size, chunk_size, left_chunk)
        starts = torch.arange(0, seq_len, chunk_size) if chunk_size > 0 else torch.zeros(0)  # -1: one chunk
        mask = adaptive_enc_mask(seq_len, starts, left_window=left_chunk)
        return mask.unsqueeze(0).expand([batch_size, -1, -1])

    return {"adaptive_enc_mask": adaptive_enc_mask, "_streaming_mask": _streaming_mask}[original.__name__]


@register_patch(
    "dynamo", "transformers.models.canine.modeling_canine.CanineAttention.forward", reports=True,
    upstream="https://github.com/huggingface/transformers/issues/47491",
)
def _patch_canine_local_attention_masked(original):
    """CANINE's local attention cuts the characters into windows with a Python loop over the sequence length, which
    fixes the length. With windows as wide as their stride (as CANINE builds them) the queries of window k read the
    keys of window k: one attention over the whole sequence whose mask leaves out every other key gives the same
    numbers (outside keys weigh exp(-inf), the padding keys inside weigh as in the window). The always-attended
    first key is a column of its own, as the windows repeat it."""

    def forward(self, hidden_states, attention_mask=None, output_attentions=False):
        windows = {self.attend_from_chunk_width, self.attend_from_chunk_stride,
                   self.attend_to_chunk_width, self.attend_to_chunk_stride}  # fmt: skip
        if not self.local or output_attentions or self.first_position_attends_to_all or len(windows) != 1:
            return original(self, hidden_states, attention_mask, output_attentions)
        report_applied()
        (width,) = windows
        positions = torch.arange(hidden_states.shape[1], device=hidden_states.device)
        in_window = (positions[:, None] // width) == (positions[None, :] // width)
        keys, padding = hidden_states, attention_mask
        if self.always_attend_to_first_position:
            keys = torch.cat([hidden_states[:, :1], hidden_states], dim=1)
            in_window = torch.cat([torch.ones_like(in_window[:, :1]), in_window], dim=1)
            padding = torch.cat([attention_mask[:, :, :1], attention_mask], dim=2)
        # the padding as the windows add it; keys outside the query's window weigh nothing, even beside padding
        additive = (1.0 - padding.float()) * torch.finfo(hidden_states.dtype).min
        additive = additive.masked_fill(~in_window, float("-inf"))
        attended = self.self(hidden_states, keys, additive.unsqueeze(1).to(hidden_states.dtype))[0]
        return (self.output(attended, hidden_states),)

    return forward
