"""Stage 2 model patches: vision towers that crop, merge and position each image's patches in a loop: Pixtral, Mistral
3's patch merger, PaddleOCR-VL, the OCR towers' global views, LightOnOcr, Emu3, the Qwen-VL position and window
helpers, MiniCPM-V, Cosmos3-Edge.
"""

from __future__ import annotations

import inspect
import math

import torch

from ...registration import register_patch, report_applied
from .grids import block_patches, computed_from_baked, geometry_baked, merged_patch_places, part_starts, patch_total, places_in_parts, resized


# ── Stage 2: Model patches ───────────────────────────────────────────────────


@register_patch(
    "dynamo", "transformers.models.pixtral.modeling_pixtral.PixtralVisionModel.forward", reports=True,
    model_side="PixtralVisionModel.forward picks the real patches of all padded grids at once with an index (and"
               " builds positions and the block mask from it) instead of slicing each image by `image_sizes` in "
               "a Python loop.",
)
def _patch_pixtral_patches_picked_at_once(original):
    """Pixtral crops each image's patches out of its padded grid with one Python slice per image (sizes read from
    `image_sizes`), lays them end to end and builds the block mask image by image: the loops fix the image count.
    Every image at once instead: the indices of the real patches of the padded grids pick them in the same order
    (image, row, column), and tell each patch's position and image."""
    from transformers.utils.generic import is_flash_attention_requested, merge_with_config_defaults
    from transformers.utils.output_capturing import capture_outputs

    def forward(self, pixel_values, image_sizes=None, **kwargs):
        whole = image_sizes is None and isinstance(pixel_values.shape[0], torch.SymInt)  # every image uncropped
        traced_sizes = isinstance(image_sizes, torch.Tensor) and not geometry_baked(image_sizes)
        if is_flash_attention_requested(self.config) or not (whole or traced_sizes):
            return inspect.unwrap(original)(self, pixel_values, image_sizes, **kwargs)
        report_applied()
        patch_embeds = self.patch_conv(pixel_values.to(dtype=self.patch_conv.weight.dtype))
        images, channels, rows, columns = patch_embeds.shape
        if whole:
            index = torch.arange(images * rows * columns, device=patch_embeds.device)
        else:
            grid = (torch.arange(rows, device=patch_embeds.device)[:, None] * columns
                    + torch.arange(columns, device=patch_embeds.device))
            sizes = (image_sizes // self.patch_size)[:, :, None, None]
            real = (grid // columns < sizes[:, 0]) & (grid % columns < sizes[:, 1])
            index = real.flatten().nonzero().squeeze(1)
            # attention branches on a sequence longer than one; a single real patch is refused at run time instead
            torch._check(index.shape[0] > 1)
        image, cell = index // (rows * columns), index % (rows * columns)
        patch_embeds = patch_embeds.permute(0, 2, 3, 1).reshape(-1, channels)[index][None]
        patch_embeds = self.ln_pre(patch_embeds)
        position_ids = torch.stack([cell // columns, cell % columns], dim=-1)
        position_embeddings = self.patch_positional_embedding(patch_embeds, position_ids)
        lowest = torch.finfo(patch_embeds.dtype).min
        attention_mask = torch.where(image[:, None] == image, 0.0, lowest).to(patch_embeds.dtype)[None, None]
        return self.transformer(patch_embeds, attention_mask=attention_mask,
                                position_embeddings=position_embeddings, **kwargs)

    return merge_with_config_defaults(capture_outputs(forward))


@register_patch(
    "dynamo", *(f"transformers.models.{module}.modeling_{module}.{prefix}PatchMerger.forward"
    for module, prefix in (("mistral3", "Mistral3"), ("lighton_ocr", "LightOnOcr"),
    ("mistral_large4", "MistralLarge4"))), reports=True,
    model_side="Mistral3PatchMerger.forward (and its LightOnOcr/Mistral Large 4 copies) gathers every image's "
               "merge x merge blocks at once from computed indices instead of splitting by image and calling "
               "unfold per image.",
)
def _patch_patch_merger_blocks_gathered(original):
    """Mistral 3's patch merger splits the patches image by image (sizes read from `image_sizes`) and unfolds each
    image's grid into blocks of merge x merge patches: the loop fixes the image count. The blocks of every image are
    counted and their patches gathered at once instead, laid out as unfold lays them (channel, then row and column
    in the block)."""

    def forward(self, image_features, image_sizes):
        if not isinstance(image_sizes, torch.Tensor) or geometry_baked(image_sizes):
            return original(self, image_features, image_sizes)
        report_applied()
        merge = self.spatial_merge_size
        rows, columns = (image_sizes // self.patch_size).unbind(-1)
        block_columns = columns // merge
        blocks = (rows // merge) * block_columns
        slots = image_features.shape[0] // merge**2  # no image has more blocks than all the patches make
        slot = torch.arange(slots, device=image_features.device)
        index = (slot < blocks[:, None]).flatten().nonzero().squeeze(1)
        torch._check(index.shape[0] > 1)  # the callers squeeze a leading 1: a single block is refused at run time
        image, local = index // slots, index % slots
        patch_starts = part_starts(rows * columns)
        source = patch_starts[image][:, None, None] + block_patches(
            local // block_columns[image], local % block_columns[image], columns[image], merge)
        merged = image_features[source].permute(0, 3, 1, 2).flatten(1)
        return self.merging_layer(merged)

    return forward


@register_patch(
    "dynamo", "transformers.models.paddleocr_vl.modeling_paddleocr_vl.PaddleOCRProjector.forward",
    reports=True,
    model_side="PaddleOCRProjector.forward gathers every image's merge x merge blocks at once (block-to-image "
               "from cumulative block counts) instead of splitting by `image_grid_thw.prod(1).tolist()` and "
               "folding per image.",
)
def _patch_paddleocr_projector_blocks_gathered(original):
    """PaddleOCR-VL's projector cuts the patches image by image (sizes read with `.tolist()`) and folds each frame's
    merge x merge blocks: the loop fixes the image count. Every block of every image at once instead: each block
    finds its image among the images' cumulative block counts, and its patches are gathered in the fold's order."""

    def forward(self, image_features, image_grid_thw):
        if not isinstance(image_grid_thw, torch.Tensor) or geometry_baked(image_grid_thw):
            return original(self, image_features, image_grid_thw)
        report_applied()
        merge = self.merge_kernel_size[0]
        frames, rows, columns = image_grid_thw.unbind(-1)
        block_columns = columns // merge
        frame_blocks = (rows // merge) * block_columns
        frame_patches = rows * columns
        patches = frames * frame_patches
        patch_starts = part_starts(patches)
        image, local = places_in_parts(frames * frame_blocks, image_features.shape[0] // merge**2)
        frame, in_frame = local // frame_blocks[image], local % frame_blocks[image]
        source = (patch_starts[image] + frame * frame_patches[image])[:, None, None] + block_patches(
            in_frame // block_columns[image], in_frame % block_columns[image], columns[image], merge)
        folded = self.pre_norm(image_features)[source].flatten(1)
        return self.linear_2(self.act(self.linear_1(folded)))

    return forward


@register_patch(
    "dynamo",
    *(f"transformers.models.{module}.modeling_{module}.{model}.get_image_features" for module, model in (
    ("deepseek_ocr2", "DeepseekOcr2Model"), ("unlimited_ocr", "UnlimitedOcrModel"), ("step3p7", "Step3p7Model"))),
    reports=True,
    model_side="DeepseekOcr2Model.get_image_features (and Unlimited OCR / Step 3.7 copies) lay out all images' "
               "global views at once as one tensor when there are no local views, instead of a Python loop over "
               "the batch.",
)
def _patch_global_views_laid_out_at_once(original):
    """DeepSeek-OCR 2, Unlimited OCR and Step 3.7 lay out each image's global view in a loop over the batch (rows
    ended by a newline token in Unlimited OCR, a view separator after each image in both OCR models), and their
    forward joins the parts again: the loop fixes the image count. With no local views, every image at once, as one
    part."""
    from transformers.utils.generic import can_return_tuple

    def get_image_features(self, pixel_values, pixel_values_local=None, *local_layout, **kwargs):
        if pixel_values_local is not None or not isinstance(pixel_values.shape[0], torch.SymInt):
            return inspect.unwrap(original)(self, pixel_values, pixel_values_local, *local_layout, **kwargs)
        report_applied()
        for name in ("num_local_patches", "patches_grid"):  # how local views are laid out: there are none
            kwargs.pop(name, None)
        return _global_views_at_once(self, pixel_values, **kwargs)

    return can_return_tuple(get_image_features)


def _global_views_at_once(model, pixel_values, **kwargs):
    """Every image's global view through the tower and projector at once, laid out as the model lays each out (rows
    ended by its newline, then its view separator), as one part of the per-image list."""
    tower = model.vision_tower if hasattr(model, "vision_tower") else model.vision_model
    outputs = tower(pixel_values, **kwargs)
    features = model.multi_modal_projector(outputs.last_hidden_state)
    images, queries, hidden = features.shape
    if hasattr(model, "image_newline"):
        side = math.isqrt(queries)
        rows = torch.cat([features.reshape(images, side, side, hidden),
                          model.image_newline.expand(images, side, 1, hidden)], dim=2)
        features = rows.flatten(1, 2)
    if hasattr(model, "view_separator"):
        features = torch.cat([features, model.view_separator.expand(images, 1, hidden)], dim=1)
    outputs.pooler_output = [features.reshape(-1, hidden)]
    return outputs


@register_patch(
    "dynamo", "transformers.models.lighton_ocr.modeling_lighton_ocr.LightOnOcrModel.get_image_features",
    reports=True,
    model_side="LightOnOcrModel.get_image_features returns the projected features whole (sizes alongside) "
               "instead of `torch.split` by sizes computed in a Python loop over image_sizes.",
)
def _patch_lighton_ocr_image_features_whole(original):
    """LightOnOcr splits its projected image features per image by sizes it reads by iterating `image_sizes`,
    which fixes the image count; its forward concatenates the parts again, so they are kept whole."""
    from transformers.utils.generic import can_return_tuple

    def get_image_features(self, pixel_values, image_sizes, **kwargs):
        if not isinstance(image_sizes, torch.Tensor) or geometry_baked(image_sizes):
            return inspect.unwrap(original)(self, pixel_values, image_sizes, **kwargs)
        report_applied()
        image_outputs = self.vision_encoder(pixel_values, image_sizes=image_sizes, return_dict=True, **kwargs)
        features = self.vision_projection(image_outputs.last_hidden_state.squeeze(0), image_sizes)
        image_outputs.pooler_output = (features,)
        return image_outputs

    return can_return_tuple(get_image_features)


@register_patch(
    "dynamo", "transformers.models.emu3.modeling_emu3.Emu3Model.get_image_features", reports=True,
    model_side="Emu3Model.get_image_features crops every image's VQ codes and appends the end-of-line tokens "
               "with one mask over the padded grid instead of a Python loop over image_sizes.",
)
def _patch_emu3_image_tokens_cropped_at_once(original):
    """Emu3 crops each image's VQ codes to the image's size and ends each kept row with an end-of-line token, image
    by image over `image_sizes`: it fixes the image count. Every image at once: the codes of the padded grid, an
    end-of-line column after each image's last kept column, and the kept cells picked by one mask in eager's order."""
    from transformers.models.emu3.modeling_emu3 import Emu3VQVAEModelOutput
    from transformers.utils.generic import can_return_tuple

    def get_image_features(self, pixel_values, image_sizes, **kwargs):
        if pixel_values.ndim != 4 or geometry_baked(image_sizes):
            return inspect.unwrap(original)(self, pixel_values, image_sizes, **kwargs)
        report_applied()
        vq = self.vqmodel
        frames = pixel_values.unsqueeze(1).repeat(1, vq.config.temporal_downsample_factor, 1, 1, 1)
        hidden_states = vq.encoder(frames.to(vq.dtype))
        quantized = vq.quant_conv(hidden_states.permute(0, 2, 1, 3, 4)).permute(0, 2, 1, 3, 4)
        codes = vq.quantize(quantized).squeeze(1)  # (images, rows, columns)
        _, rows, columns = codes.shape
        mapping = self.vocabulary_mapping
        tokens = mapping.img2bpe_mapping_tensor.to(codes.device)[codes]
        tokens = torch.nn.functional.pad(tokens, (0, 1), value=mapping.eol_token_id)
        kept_rows, kept_columns = (image_sizes // vq.vision_spatial_factor).unbind(-1)
        row = torch.arange(rows, device=codes.device)[None, :, None]
        column = torch.arange(columns + 1, device=codes.device)[None, None, :]
        row_end = column == kept_columns[:, None, None]
        tokens = torch.where(row_end, mapping.eol_token_id, tokens)
        kept = (row < kept_rows[:, None, None]) & (column <= kept_columns[:, None, None])
        embeddings = self.get_input_embeddings()(tokens[kept])
        return Emu3VQVAEModelOutput(last_hidden_state=hidden_states, pooler_output=(embeddings,))

    return can_return_tuple(get_image_features)


@register_patch(
    "dynamo", *(f"transformers.models.{module}.modeling_{module}.get_vision_position_ids" for module in (
    "muse_spark", "muse_glimmer", "kimi_k25", "qwen2_vl", "minimax_m3_vl", "inkling2")), reports=True,
    model_side="transformers' get_vision_position_ids (vision_utils, used by qwen2_vl, kimi_k25, minimax_m3_vl, "
               "inkling2, muse_spark, muse_glimmer) computes every patch's (row, column) for all images at once "
               "from cumulative frame sizes with tensor ops, instead of a Python loop over `grid_thw.tolist()`.",
)
def _patch_vision_positions_at_once(original):
    """`get_vision_position_ids` builds each image's (row, column) grid in a loop over `grid_thw.tolist()`, which
    fixes the image count; a composite model cannot take them precomputed (its text model reads `position_ids`),
    nor can a retriever that calls its tower directly (ColQwen2). For one merge size, every patch at once: its frame
    found among the frames' cumulative sizes, then its merge block and its place in the block from its offset in the
    frame. ExecuTorch plans memory for the total's upper bound: where no input axis bounds it before it sizes a
    tensor (Muse Spark, ColQwen2), the dynamic cell fails at `to-executorch`."""

    def get_vision_position_ids(grid_thw, spatial_merge_size, include_temporal=False, kwargs=None):
        precomputed = kwargs is not None and kwargs.get("position_ids") is not None
        if precomputed or not isinstance(spatial_merge_size, int) or geometry_baked(grid_thw):
            return original(grid_thw, spatial_merge_size, include_temporal, kwargs)
        report_applied()
        total = patch_total(grid_thw)
        frame, _, _, _, rows, columns = merged_patch_places(grid_thw, spatial_merge_size, total)
        if not include_temporal:
            return torch.stack([rows, columns], dim=-1)
        frame_ends = grid_thw[:, 0].cumsum(0)  # each patch's frame, counted within its image or video
        image = torch.searchsorted(frame_ends, frame, right=True)
        return torch.stack([frame - (frame_ends - grid_thw[:, 0])[image], rows, columns], dim=-1)

    return get_vision_position_ids


@register_patch(
    "dynamo", *(f"transformers.models.{module}.modeling_{module}.get_vision_nearest_position_ids"
    for module in ("minicpm_ocr", "minicpmv4_6", "minicpmv4_7")), reports=True,
    model_side="transformers' get_vision_nearest_position_ids (MiniCPM-OCR / MiniCPM-V 4.6 / 4.7 vision towers) "
               "computes every patch's bucketed row/column position with batched tensor ops over `target_sizes` "
               "instead of a Python loop over `target_sizes.tolist()`.",
)
def _patch_nearest_positions_at_once(original):
    """MiniCPM-V's towers map each patch to the nearest cell of their position table in a loop over
    `target_sizes.tolist()`: it fixes the image count, and a composite model cannot take them precomputed. Every
    patch at once instead: its row and column in its image (`merged_patch_places`, blocks of one), bucketed."""

    def get_vision_nearest_position_ids(target_sizes, num_patches_per_side, kwargs=None):
        if (kwargs is not None and kwargs.get("position_ids") is not None) or geometry_baked(target_sizes):
            return original(target_sizes, num_patches_per_side, kwargs=kwargs)
        report_applied()
        total = patch_total(target_sizes)
        grid = torch.nn.functional.pad(target_sizes, (1, 0), value=1)  # one frame each
        _, _, rows, columns, row, column = merged_patch_places(grid, 1, total)
        cells = 1 / num_patches_per_side
        boundaries = torch.arange(cells, 1.0, cells, device=target_sizes.device)
        bucket_row = torch.bucketize(row / rows, boundaries, right=True)
        bucket_column = torch.bucketize(column / columns, boundaries, right=True)
        return bucket_row * num_patches_per_side + bucket_column

    return get_vision_nearest_position_ids


@register_patch(
    "dynamo", "transformers.models.cosmos3_edge.modeling_cosmos3_edge.Cosmos3EdgeVisionEmbeddings"
    ".resize_positional_embeddings", reports=True,
    model_side="Cosmos3EdgeVisionEmbeddings.resize_positional_embeddings resizes the position grid for all "
               "frames at once with tensor ops (per-patch row/column bilinear weights) instead of looping over "
               "`grid_thw.tolist()`.",
)
def _patch_cosmos3_edge_positions_resized_at_once(original):
    """Cosmos3-Edge resizes its position grid to each frame's patch grid in a loop over `grid_thw.tolist()`, which
    fixes the image count. Every patch at once instead, as `_patch_siglip2_positions_resized_as_tensors` does: its
    row and column in its frame (merge-block order, `merged_patch_places`) and their antialiased bilinear weights."""

    def resize_positional_embeddings(positional_embeddings, grid_thw, spatial_merge_size):
        if geometry_baked(grid_thw):
            return original(positional_embeddings, grid_thw, spatial_merge_size)
        report_applied()
        total = patch_total(grid_thw)
        _, _, rows, columns, row, column = merged_patch_places(grid_thw, spatial_merge_size, total)
        return resized(positional_embeddings, rows, row, columns, column)

    return resize_positional_embeddings


@register_patch(
    "dynamo", *(f"transformers.models.{module}.modeling_{module}.get_vision_window_index"
    for module in ("minicpm_ocr", "minicpmv4_6", "minicpmv4_7")), reports=True,
    model_side="transformers' get_vision_window_index (MiniCPM-OCR / MiniCPM-V 4.6 / 4.7) builds the "
               "window-major patch order for all images at once with tensor ops instead of a Python loop over "
               "`grid_thw.tolist()`.",
)
def _patch_whole_windows_at_once(original):
    """MiniCPM-V's window merger orders each image's patches window by window in a loop over `grid_thw.tolist()`,
    which fixes the image count. Its grids are whole windows (the merger checks it), so the order is the merge-block
    layout with windows for blocks: `merged_patch_places` gives every slot's patch, and the windows' bounds step by
    a window's size. A static export knows the grids: the order is computed once, a constant of the program."""

    def get_vision_window_index(grid_thw, spatial_merge_size, window_size, patch_size, kwargs=None):
        fed = kwargs is not None and kwargs.get("window_index") is not None
        if fed or (spatial_merge_size, patch_size) != (1, 1):
            return original(grid_thw, spatial_merge_size, window_size, patch_size, kwargs)
        report_applied()
        if geometry_baked(grid_thw):
            return computed_from_baked(original, grid_thw, spatial_merge_size, window_size, patch_size)
        total = patch_total(grid_thw)
        _, start, _, columns, row, column = merged_patch_places(grid_thw, window_size, total)
        bounds = torch.arange(0, total + 1, window_size**2, device=grid_thw.device, dtype=torch.int32)
        return start + row * columns + column, bounds

    return get_vision_window_index


@register_patch(
    "dynamo", *(f"transformers.models.{module}.modeling_{module}.{prefix}Merger.forward"
    for module, prefix in (("minicpm_ocr", "MiniCPMOcr"), ("minicpmv4_6", "MiniCPMV4_6"),
    ("minicpmv4_7", "MiniCPMV4_7"))), reports=True,
    model_side="MiniCPMOcrMerger / MiniCPMV4_6Merger / MiniCPMV4_7Merger.forward fold every image's merge x "
               "merge blocks in one batched gather per round instead of a Python loop over the images.",
)
def _patch_minicpm_merger_blocks_gathered(original):
    """MiniCPM-V's merger folds each image's patch grid into merge x merge blocks, round after round, in a Python
    loop over the images: it fixes the image count. Every image's blocks at once instead, each round: the patches
    of each block gathered (`block_patches`) in the order the fold lays them out, and the round's projection."""

    def forward(self, hidden_states, target_sizes):
        merge, merge_w = self.merge_kernel_size
        if geometry_baked(target_sizes) or merge != merge_w:
            return original(self, hidden_states, target_sizes)
        report_applied()
        features, sizes = hidden_states[0], target_sizes
        for projection in self.mlp:  # one per round
            merged = sizes // merge
            grid = torch.nn.functional.pad(merged, (1, 0), value=1)  # one frame each
            _, start, _, columns, row, column = merged_patch_places(grid, 1, features.shape[0] // merge**2)
            source = start[:, None, None] * merge**2 + block_patches(row, column, columns * merge, merge)
            features = projection(features[source.flatten(1)].flatten(1))
            sizes = merged
        return [features]

    return forward
