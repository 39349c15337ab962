"""Stage 2 model patches: vision towers that walk their image grids image by image: Ernie 4.5-VL, VideoLLaMA 3, HunYuan-
VL, RADIO, Nemotron-H Omni, LFM3-VL, UDOP.
"""

from __future__ import annotations

import importlib
import inspect

import torch

from ...registration import register_patch, report_applied
from .grids import block_patches, geometry_baked, merged_patch_places, part_starts, patch_total, places_in_parts, resized
from .lengths import WholeSplit


# ── Stage 2: Model patches ───────────────────────────────────────────────────


@register_patch(
    "dynamo", "transformers.models.ernie4_5_vl_moe.modeling_ernie4_5_vl_moe"
    ".Ernie4_5_VLMoeVariableResolutionResamplerModel._temporal_slicing", reports=True,
    model_side="Ernie4_5_VLMoeVariableResolutionResamplerModel._temporal_slicing pairs even/odd frames for all "
               "videos at once with index tensors derived from `grid_thw` instead of Python loops over "
               "`grid_thw` and range(frame count).",
)
def _patch_ernie_vl_frame_pairs_at_once(original):
    """Ernie 4.5-VL's resampler pairs each video's even frames with its odd ones (an image with itself) in a loop over
    `grid_thw` and Python ranges of its frame counts: it fixes the image count. Every merged token's two rows at once
    instead, from its image, its pair and its place in the frame; a video's odd last frame is dropped as eager's
    `zip` drops it."""

    def _temporal_slicing(self, hidden_states, grid_thw):
        if geometry_baked(grid_thw):
            return original(self, hidden_states, grid_thw)
        report_applied()
        frames = grid_thw[:, 0]
        frame_tokens = grid_thw[:, 1:].prod(-1) // self.spatial_merge_size**2
        pairs = torch.where(frames > 1, frames // 2, 1)
        starts = part_starts(frames * frame_tokens)
        total = patch_total(torch.stack([pairs, frame_tokens], dim=-1))
        image, within = places_in_parts(pairs * frame_tokens, total)
        pair, token = within // frame_tokens[image], within % frame_tokens[image]
        first = starts[image] + 2 * pair * frame_tokens[image] + token
        second = first + (frames[image] > 1).long() * frame_tokens[image]
        return torch.cat([hidden_states.index_select(0, first), hidden_states.index_select(0, second)], dim=-1)

    return _temporal_slicing


@register_patch(
    "dynamo", "transformers.models.video_llama_3.modeling_video_llama_3.VideoLlama3VisionModel"
    ".pixel_unshuffle", reports=True,
    model_side="VideoLlama3VisionModel.pixel_unshuffle downsamples every image's merge blocks at once (a batched"
               " gather with the bilinear weights) instead of interpolating image by image over `grid_thw`.",
)
def _patch_video_llama3_blocks_shrunk_at_once(original):
    """VideoLLaMA 3's tower lays each image's merge blocks back out in rows and shrinks the grid by the image's merge
    size (bilinear), image by image over `grid_thw`: it fixes the image count. A shrink by a whole factor samples
    each block's middle (one patch for an odd merge size, the middle four halfway for an even one): every block at
    once instead, from its patches, with eager's weights."""

    def pixel_unshuffle(self, hidden_states, grid_thw, merge_sizes):
        if geometry_baked(grid_thw):
            return original(self, hidden_states, grid_thw, merge_sizes)
        report_applied()
        frames, rows, columns = grid_thw.unbind(-1)
        merges = merge_sizes.to(grid_thw.dtype)
        blocks = torch.stack([frames, rows // merges, columns // merges], dim=-1)
        image, block = places_in_parts(blocks.prod(-1), patch_total(blocks, at_most=hidden_states.shape[0]))
        patches = grid_thw.prod(-1)
        merge = merges[image]
        first = part_starts(patches)[image] + block * merge * merge
        near, far = (merge - 1) // 2, merge // 2
        weight = (merge % 2 == 0).to(hidden_states.dtype)[:, None] / 2  # the source's fraction past `near`

        def between(row, left, right):
            return (1 - weight) * hidden_states[first + row * merge + left] + weight * hidden_states[
                first + row * merge + right]

        return (1 - weight) * between(near, near, far) + weight * between(far, near, far)

    return pixel_unshuffle


@register_patch(
    "dynamo", "transformers.models.hunyuan_vl.modeling_hunyuan_vl.HunYuanVLVisionPatchEmbed.forward",
    reports=True,
    model_side="HunYuanVLVisionPatchEmbed.forward computes every patch's resized position embedding for all "
               "images at once (precomputed interpolation taps) instead of interpolating the position table "
               "image by image over `grid_thw`.",
)
def _patch_hunyuan_vl_positions_resized_at_once(original):
    """HunYuan-VL resizes its position table to each image's grid, image by image over `grid_thw`: it fixes the
    image count. Every patch's position at once instead, from transformers' taps for all images."""
    from transformers.vision_utils import get_vision_interpolation_indices_and_weights

    def forward(self, pixel_values, grid_thw):
        if not isinstance(grid_thw, torch.Tensor) or geometry_baked(grid_thw):
            return original(self, pixel_values, grid_thw)
        report_applied()
        patches = pixel_values.reshape(-1, self.config.num_channels, self.patch_size, self.patch_size)
        embeddings = self.patch_embedding(patches.to(self.patch_embedding.weight.dtype)).flatten(1)
        indices, weights = get_vision_interpolation_indices_and_weights(grid_thw, self.position_edge,
                                                                        self.config.interpolate_mode)
        table = self.position_embedding.weight[1:].float()  # the first row is the class token's
        positions = (table[indices] * weights[..., None]).sum(1).to(embeddings.dtype)
        return (embeddings + positions).unsqueeze(0)

    return forward


@register_patch(
    "dynamo", "transformers.models.hunyuan_vl.modeling_hunyuan_vl.HunYuanVLVisionTransformer.forward",
    reports=True,
    model_side="HunYuanVLVisionTransformer.forward merges patches, appends row newlines and begin/end tokens for"
               " all images in one batched gather instead of a Python loop over `grid_thw.tolist()`.",
)
def _patch_hunyuan_vl_images_merged_at_once(original):
    """HunYuan-VL's tower merges each image's patches (a strided convolution), ends each merged row with a newline
    and puts the image between begin and end tokens, image by image over `grid_thw.tolist()`: it fixes the image
    count. Every image at once instead: each merged cell from its block's patches, then every image's layout
    gathered from the cells and the newline."""
    from transformers.modeling_outputs import BaseModelOutputWithPooling
    from transformers.models.hunyuan_vl import modeling_hunyuan_vl
    from transformers.utils.generic import merge_with_config_defaults
    from transformers.utils.output_capturing import capture_outputs

    def forward(self, pixel_values, grid_thw, **kwargs):
        if geometry_baked(grid_thw):
            return inspect.unwrap(original)(self, pixel_values, grid_thw, **kwargs)
        report_applied()
        hidden_states = self.embeddings(pixel_values, grid_thw)
        cu_seqlens, max_seqlen = modeling_hunyuan_vl.get_vision_attention_seqlens(grid_thw, self.config, kwargs=kwargs)
        for layer in self.layers:
            hidden_states = layer(hidden_states, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen, attention_mask=None,
                                  **kwargs)
        merged = _hunyuan_vl_merged(self.patch_merger, hidden_states[0], grid_thw)
        return BaseModelOutputWithPooling(last_hidden_state=hidden_states, pooler_output=merged[None])

    return merge_with_config_defaults(capture_outputs(forward))


def _hunyuan_vl_merged(merger, patches, grid_thw):
    """HunYuan-VL's merger over every image at once (one frame each, as the merger reshapes them): the cells, each
    image's begin, rows of cells each ended by the newline, and end."""
    merge = merger.spatial_merge_size
    rows, columns = grid_thw[:, 1], grid_thw[:, 2]
    cell_rows, cell_columns = rows // merge, columns // merge
    cells = torch.stack([cell_rows, cell_columns], dim=-1)
    image, cell = places_in_parts(cells.prod(-1), patch_total(cells))
    starts = part_starts(rows * columns)
    source = starts[image][:, None, None] + block_patches(
        cell // cell_columns[image], cell % cell_columns[image], columns[image], merge)
    blocks = merger.before_rms(patches)[source]  # (cells, merge, merge, channels)
    convolution = merger.proj_conv
    folded = torch.nn.functional.linear(blocks.permute(0, 3, 1, 2).flatten(1), convolution.weight.flatten(1),
                                        convolution.bias)
    projected = merger.proj_out(merger.proj_act(folded)[:, :, None, None]).flatten(1)
    rows_of = torch.cat([projected, merger.image_newline[None].to(projected.dtype)])  # the newline last

    layouts = cell_rows * (cell_columns + 1) + 2
    image, slot = places_in_parts(layouts, patch_total(layouts[:, None]))
    place, width = slot - 1, cell_columns[image] + 1  # place: within the rows, after the begin token
    first_cell = part_starts(cells.prod(-1))[image]
    is_cell = (slot > 0) & (slot < layouts[image] - 1) & (place % width < width - 1)
    picked = torch.where(is_cell, first_cell + place // width * (width - 1) + place % width, projected.shape[0])
    tokens = merger.mlp(rows_of[picked])
    begin, end = (slot == 0)[:, None], (slot == layouts[image] - 1)[:, None]
    tokens = torch.where(begin, merger.image_begin.to(tokens.dtype), torch.where(end, merger.image_end, tokens))
    return merger.after_rms(tokens)


@register_patch(
    "dynamo", "transformers.models.radio.modeling_radio.RadioPatchEmbeddings._embed_packed_patches",
    reports=True,
    model_side="RadioPatchEmbeddings._embed_packed_patches embeds all packed images at once (prefix tokens and "
               "patches with their resized positions gathered by index tensors) instead of a Python loop over "
               "`image_grid_hw.tolist()`.",
)
def _patch_radio_packed_images_at_once(original):
    """RADIO embeds packed images one by one over `image_grid_hw.tolist()` (its class and register tokens, then its
    patches with the position table resized to a square of its longer side, cropped): it fixes the image count.
    Every token at once instead: its image, and a token of the prefix or a patch with its resized position."""

    def _embed_packed_patches(self, pixel_values, image_grid_hw):
        if geometry_baked(image_grid_hw):
            return original(self, pixel_values, image_grid_hw)
        report_applied()
        patches = self.patch_projection(pixel_values)
        prefix = self.cls_register_token.shape[0]
        heights, widths = image_grid_hw.unbind(-1)
        counts = heights * widths
        image, slot = places_in_parts(counts + prefix, patch_total(image_grid_hw) + prefix * image_grid_hw.shape[0])
        patch = (slot - prefix).clamp(min=0)  # the prefix's slots read patch 0 of their image, then the prefix
        side = torch.maximum(heights, widths)[image]
        table = self.position_embedding.reshape(self.max_rows, self.max_cols, -1)
        positions = resized(table.float(), side, patch // widths[image], side, patch % widths[image], antialias=False)
        embedded = patches[part_starts(counts)[image] + patch] + positions.to(patches.dtype)
        tokens = self.cls_register_token[slot.clamp(max=prefix - 1)]
        return torch.where((slot < prefix)[:, None], tokens, embedded).unsqueeze(0)

    return _embed_packed_patches


@register_patch(
    "dynamo", "transformers.models.nemotron_h_omni.modeling_nemotron_h_omni.NemotronH_Omni_Reasoning_V3"
    ".get_image_features", reports=True,
    model_side="NemotronH_Omni_Reasoning_V3.get_image_features pixel-shuffles every image's 2x2 patch blocks in "
               "one batched gather instead of a loop over `image_grid_hw.tolist()`.",
)
def _patch_nemotron_h_omni_images_shuffled_at_once(original):
    """Nemotron-H Omni pixel-shuffles each image's features (every 2 x 2 block of patches into one token) image by
    image over `image_grid_hw.tolist()`: it fixes the image count. The shuffle lays out each block's patches in their
    row-major order: every block at once instead, gathered."""
    from transformers.modeling_outputs import BaseModelOutputWithPooling
    from transformers.utils.generic import can_return_tuple

    def get_image_features(self, pixel_values, image_grid_hw, **kwargs):
        if self.config.downsample_ratio != 0.5 or geometry_baked(image_grid_hw):
            return inspect.unwrap(original)(self, pixel_values, image_grid_hw, **kwargs)
        report_applied()
        torch._check_tensor_all(image_grid_hw.prod(-1).sum() == pixel_values.shape[0],
                                lambda: "`pixel_values` and `image_grid_hw` count different patches")
        outputs = self.vision_model(pixel_values.to(self.vision_model.config.torch_dtype),
                                    image_grid_hw=image_grid_hw, **kwargs)
        features = outputs.features
        if self.vision_final_layernorm is not None:
            features = self.vision_final_layernorm(features)
        heights, widths = image_grid_hw.unbind(-1)
        blocks = image_grid_hw // 2
        image, block = places_in_parts(blocks.prod(-1), patch_total(blocks))
        block_columns = blocks[image, 1]
        first = part_starts(heights * widths)
        source = first[image][:, None, None] + block_patches(block // block_columns, block % block_columns,
                                                              widths[image], 2)
        projected = self.multi_modal_projector(features[source].flatten(1))
        return BaseModelOutputWithPooling(last_hidden_state=outputs.last_hidden_state, pooler_output=(projected,),
                                          hidden_states=outputs.hidden_states, attentions=outputs.attentions)

    return can_return_tuple(get_image_features)


@register_patch(
    "dynamo", "transformers.models.lfm3_vl.modeling_lfm3_vl.Lfm3VlVisionShortConv.forward", reports=True,
    model_side="Lfm3VlVisionShortConv.forward applies its depthwise convolution to all frames at once via "
               "neighbour-index gathers in the merge-block layout (or a padded batched conv) instead of a Python"
               " loop over the grid's `.tolist()`.",
)
def _patch_lfm3_vl_convolution_by_neighbours(original):
    """LFM3-VL's vision layers convolve each frame on its own grid, in a loop over the grid's `.tolist()`: it fixes the
    image count. Every patch at once instead: for each tap of the depthwise kernel, the neighbour patch at that
    offset in its frame (zero outside it), found in the merge-block layout, weighted and summed."""

    def forward(self, hidden_states, grid_thw, **kwargs):
        if not isinstance(grid_thw, WholeSplit):
            return original(self, hidden_states, grid_thw, **kwargs)
        report_applied()
        input_gate, output_gate, conv_input = self.in_proj(hidden_states).chunk(3, dim=-1)
        gated = input_gate * conv_input
        merge, conv = self.spatial_merge_size, self.spatial_conv
        _, start, rows, columns, row, column = merged_patch_places(grid_thw.tensor, merge, gated.shape[0])
        size, pad = conv.kernel_size[0], conv.padding[0]
        convolved = gated.new_zeros(gated.shape) + (0 if conv.bias is None else conv.bias)
        for tap_row in range(size):
            for tap_column in range(size):
                near_row, near_column = row + tap_row - pad, column + tap_column - pad
                inside = (near_row >= 0) & (near_row < rows) & (near_column >= 0) & (near_column < columns)
                near_row = torch.minimum(near_row.clamp(min=0), rows - 1)
                near_column = torch.minimum(near_column.clamp(min=0), columns - 1)
                block = near_row // merge * (columns // merge) + near_column // merge
                near = start + block * merge * merge + near_row % merge * merge + near_column % merge
                convolved = convolved + gated[near] * inside[:, None] * conv.weight[:, 0, tap_row, tap_column]
        return self.out_proj(output_gate * convolved)

    return forward


@register_patch(
    "dynamo", "transformers.models.udop.modeling_udop.combine_image_text_embeddings",
    model_side="transformers' udop combine_image_text_embeddings selects the patches no token landed on with a "
               "fixed-size sort/gather (free patches first, zero-filled to the patch count) instead of "
               "boolean-mask selection per sample.",
)
def _patch_udop_patches_as_fixed_rows(original):
    """UDOP adds to each token the image patch under its box centre, then appends the patches no token landed on,
    picked sample by sample with a boolean mask and zero-padded to the patch count: sizes that depend on the boxes'
    values. Sorting the patches free ones first (each keeps its index as its key) picks the same patches in the
    same order, and zeros the rest, at the fixed size the padding gives anyway."""

    def combine(image_embeddings, inputs_embeds, bbox, visual_bbox, attention_mask=None, num_patches=14, max_len=0,
                image_size=224, patch_size=16):
        if max_len != 0:  # padded to another length than the patch count
            return original(image_embeddings, inputs_embeds, bbox, visual_bbox, attention_mask, num_patches, max_len,
                            image_size, patch_size)

        def centre(low, high):  # the patch column (or row) of each token's box centre
            return ((bbox[:, :, low] + bbox[:, :, high]) / 2.0 * num_patches).floor().long().clip(0, num_patches - 1)

        landed = centre(0, 2) + centre(1, 3) * num_patches
        bbox = bbox.to(torch.float32 if bbox.device.type == "mps" else torch.float64)
        no_box = ((bbox.mean(-1) == 0.0) | (bbox.mean(-1) == 1.0))[..., None]
        under = image_embeddings.gather(1, landed[..., None].expand(-1, -1, image_embeddings.size(-1)))
        inputs_embeds += torch.where(no_box, torch.zeros_like(under), under)

        free = torch.ones(image_embeddings.shape[:2], dtype=torch.bool, device=image_embeddings.device)
        free = free.scatter(1, landed, False)
        position = torch.arange(free.size(1), device=free.device)
        order = torch.argsort(torch.where(free, position, position + free.size(1)), dim=1)  # free ones first
        in_use = free.gather(1, order)[..., None]

        def free_rows(rows):
            picked = rows.gather(1, order[..., None].expand(-1, -1, rows.size(-1)))
            return torch.where(in_use, picked, torch.zeros_like(picked))

        if visual_bbox is None:
            visual_bbox = get_visual_bbox(image_size=image_size, patch_size=patch_size).to(image_embeddings.device)
            visual_bbox = visual_bbox.unsqueeze(0).repeat(image_embeddings.size(0), 1, 1)
        inputs_embeds = torch.cat([inputs_embeds, free_rows(image_embeddings)], 1)
        bbox = torch.cat([bbox, free_rows(visual_bbox)], 1)
        if attention_mask is not None:
            attention_mask = torch.cat([attention_mask, in_use[..., 0].to(attention_mask.dtype)], 1)
        return inputs_embeds, bbox, attention_mask

    get_visual_bbox = importlib.import_module(original.__module__).get_visual_bbox
    return combine
