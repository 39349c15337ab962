"""Stage 2 model patches: images of several sizes in one batch: LLaVA's features as one image, SigLIP 2's position grid
resized as tensors, LFM2-VL's images projected at once, the any-resolution tilers (LLaVA-NeXT and its kin) packed at
once.
"""

from __future__ import annotations

import inspect
import math

import torch

from ...registration import register_patch, report_applied
from .grids import block_patches, geometry_baked, resized


# ── Stage 2: Model patches ───────────────────────────────────────────────────


@register_patch(
    "dynamo", "transformers.models.llava.modeling_llava.LlavaMultiModalProjector.forward",
    model_side="LlavaModel.get_image_features returns the projected features as one tensor (sizes alongside) "
               "instead of `list(image_features)` / `torch.split(..., sizes.tolist())` that forward concatenates"
               " right back.",
)
def _patch_llava_features_as_one_image(original):
    """LLaVA splits its projected image features into a list, one tensor per image, which the model concatenates
    right back: iterating the image axis fixes the image count. The projector hands its rows on as one image, which
    the list and the concatenation leave as they are: the same rows in the same order."""

    def forward(self, image_features):
        projected = original(self, image_features)
        return projected.flatten(0, -2)[None]

    return forward


@register_patch(
    "dynamo", "transformers.models.siglip2.modeling_siglip2.Siglip2VisionEmbeddings.resize_positional_embeddings",
    model_side="Siglip2VisionEmbeddings.resize_positional_embeddings resizes the position grid for every image "
               "at once with tensor-valued sizes (computed interpolation weights) instead of a Python loop over "
               "the batch reading each spatial shape as numbers.",
)
def _patch_siglip2_positions_resized_as_tensors(original):
    """SigLIP 2 resizes its position grid to each image's patch grid in a Python loop over the batch, reading each
    size as numbers: the batch is fixed to the traced one and the sizes become data-dependent. Every padded position
    of every image is computed at once instead: its row and column in its image's grid, and the antialiased bilinear
    weights of those (padding repeats the first position, as eager writes it). Where an image is one patch wide,
    torch's CPU kernel answers otherwise (one value for the whole column): this is the resize it means."""

    def resize_positional_embeddings(positional_embeddings, spatial_shapes, max_length):
        if not isinstance(spatial_shapes, torch.Tensor):
            return original(positional_embeddings, spatial_shapes, max_length)
        rows, columns = spatial_shapes[:, :1], spatial_shapes[:, 1:]
        positions = torch.arange(max_length, device=spatial_shapes.device)[None]
        positions = torch.where(positions < rows * columns, positions, 0)
        return resized(positional_embeddings, rows, positions // columns, columns, positions % columns)

    return resize_positional_embeddings


@register_patch(
    "dynamo", "transformers.models.lfm2_vl.modeling_lfm2_vl.Lfm2VlModel.get_image_features",
    model_side="Lfm2VlModel.get_image_features gathers and projects every image's 2x2 patch blocks at once from "
               "the padded rows instead of looping over `range(last_hidden_state.size(0))` to cut and fold each "
               "image.",
)
def _patch_lfm2_vl_images_projected_at_once(original):
    """LFM2-VL projects its images one by one in a Python loop: it cuts each image's patches out of the padded rows,
    folds each 2x2 block of patches into one vector and projects them; the loop fixes the image count. Every image
    at once instead: the patches of every block are gathered from the padded rows (in the order the fold lays them
    out, so the projector's fold leaves them as they are), projected, and the blocks each image really has kept."""

    def get_image_features(self, pixel_values, spatial_shapes, pixel_attention_mask, **kwargs):
        if not isinstance(spatial_shapes, torch.Tensor):
            return original(self, pixel_values, spatial_shapes, pixel_attention_mask, **kwargs)
        image_outputs = self.vision_tower(pixel_values=pixel_values, spatial_shapes=spatial_shapes,
                                          pixel_attention_mask=pixel_attention_mask, **{**kwargs, "return_dict": True})
        patches = image_outputs.last_hidden_state  # (images, padded patches, channels)
        images, padded, channels = patches.shape
        factor = self.multi_modal_projector.factor
        rows, columns = spatial_shapes[:, 0, None], spatial_shapes[:, 1, None]
        block = torch.arange(padded // factor**2, device=patches.device)[None]
        blocks_per_row = columns // factor
        kept = block < (rows // factor) * blocks_per_row
        block = torch.where(kept, block, 0)
        source = block_patches(block // blocks_per_row, block % blocks_per_row, columns, factor)
        source = source.flatten(1)  # (images, blocks x factor x factor)
        gathered = patches.gather(1, source[..., None].expand(-1, -1, channels))
        folded = gathered.reshape(images, -1, factor, channels)  # the projector folds (row, column) blocks
        projected = self.multi_modal_projector(folded).flatten(1, 2)
        image_outputs.pooler_output = [projected[kept]]
        return image_outputs

    return get_image_features


_ANYRES_MODELS = (("llava_next", "LlavaNextModel"), ("llava_next_video", "LlavaNextVideoModel"),
                  ("llava_onevision", "LlavaOnevisionModel"), ("granite4_vision", "Granite4VisionModel"))


class _AnyresImages:
    """LLaVA-NeXT-style images kept together for the export, given in place of ``image_sizes``: the model's code
    reads them as one image holding every image's tiles, so its count, split and pack leave the tiles together, and
    the patched pack lays every image out at once from ``sizes``."""

    def __init__(self, sizes: torch.Tensor, tiles_per_image: int):
        self.sizes, self.tiles_per_image = sizes, tiles_per_image

    def __iter__(self):
        return iter((self,))

    def __len__(self):
        return 1


def _best_resolutions(sizes: torch.Tensor, resolutions: torch.Tensor) -> torch.Tensor:
    """`select_best_resolution` for every (height, width) row of ``sizes`` at once: the index of the first
    resolution that keeps the most of the image, then wastes the least."""
    original_height, original_width = sizes.double().unbind(-1)
    height, width = resolutions.double().unbind(-1)
    scale = torch.minimum(width / original_width[:, None], height / original_height[:, None])
    kept = ((original_width[:, None] * scale).floor() * (original_height[:, None] * scale).floor())
    kept = torch.minimum(kept, (original_width * original_height)[:, None])
    wasted = height * width - kept
    return (kept * (height * width).max() + 1 - wasted).argmax(-1)  # wasted <= area: more kept always wins


def _anyres_packed(tiles, images: _AnyresImages, pinpoints, tile_size: int, newline):
    """What LLaVA-NeXT's `pack_image_features` gives, for every image at once: each image's first tile (its
    overview), then its other tiles laid out as the grid its best resolution picks, unpadded to the image's aspect
    and ended row by row by ``newline``. ``tiles``: (images x tiles per image, tokens, channels). Returns the
    images' features end to end, and each image's length."""
    sizes, device = images.sizes, tiles.device
    tokens = tiles.shape[1]
    side = math.isqrt(tokens)  # tokens per tile side
    resolutions = torch.tensor(pinpoints, device=device)
    grid = (resolutions // tile_size)[_best_resolutions(sizes, resolutions)][:, :, None, None]
    height, width = grid[:, 0] * side, grid[:, 1] * side  # (images, 1, 1)
    original_height, original_width = sizes[:, 0, None, None], sizes[:, 1, None, None]
    # unpad_image: the side the image's aspect leaves short loses its padding, half at each end
    # in double precision as eager's Python floats; round(x, 7) spelt in core ops (ExecuTorch has no round.decimals)
    exact_height, exact_width = original_height.double(), original_width.double()
    unpadded_height = ((exact_height * (width / exact_width) * 1e7).round() / 1e7).floor().long()
    unpadded_width = ((exact_width * (height / exact_height) * 1e7).round() / 1e7).floor().long()
    wider = original_width * height > width * original_height
    top = torch.where(wider, (height - unpadded_height) // 2, 0)
    left = torch.where(wider, 0, (width - unpadded_width) // 2)
    most_rows = max(height // tile_size for height, _ in pinpoints) * side
    most_columns = max(width // tile_size for _, width in pinpoints) * side
    row = torch.arange(most_rows, device=device)[:, None]
    column = torch.arange(most_columns + 1, device=device)  # the last column: the row's newline
    ends_row = column == most_columns
    inside = ((row >= top) & (row < height - top) & (ends_row | (column >= left) & (column < width - left)))
    if newline is None:
        inside &= ~ends_row
    image = torch.arange(sizes.shape[0], device=device)[:, None]
    first_tile = image * images.tiles_per_image
    tile = first_tile[..., None] + 1 + (row // side) * grid[:, 1] + column // side
    source = torch.where(ends_row, tiles.shape[0] * tokens, tile * tokens + (row % side) * side + column % side)
    overview = first_tile * tokens + torch.arange(tokens, device=device)
    order = torch.cat([overview, source.flatten(1)], dim=1)
    kept = torch.cat([torch.ones_like(overview, dtype=torch.bool), inside.flatten(1)], dim=1)
    table = tiles.flatten(0, 1)
    if newline is not None:
        table = torch.cat([table, newline[None].to(table)])
    return table[order[kept]], kept.sum(1)


@register_patch(
    "dynamo", *(f"transformers.models.{module}.modeling_{module}.{model}.get_image_features"
    for module, model in _ANYRES_MODELS), reports=True,
    model_side="LlavaNextModel.get_image_features (and its LLaVA-NeXT-Video/OneVision/Granite 4 Vision copies) "
               "count and cut each image's tiles with tensor arithmetic on image_sizes instead of per-image "
               "Python loops over numbers read from image_sizes.",
)
def _patch_anyres_images_packed_at_once(original):
    """LLaVA-NeXT-style models read each image's size as numbers to count its tiles (the best of the configured
    resolutions), cut them out of the padded tiles, split the features per image and unpad each image's grid: the
    loops fix the image count and the sizes become data-dependent. The tiles of every image go through the tower
    together instead (a padding tile changes no other), and `_patch_anyres_packs_at_once` lays them out with the
    sizes as tensors. OneVision also shrinks a grid too large for `vision_aspect_ratio`: where its resolutions can
    give one, the model's own code runs."""
    shrinks = "vision_aspect_ratio" in inspect.signature(original).parameters

    def get_image_features(self, pixel_values, image_sizes, *args, **kwargs):
        config = self.config
        tile_grids = [(height // config.vision_config.image_size) * (width // config.vision_config.image_size)
                      for height, width in config.image_grid_pinpoints]
        aspect = kwargs.get("vision_aspect_ratio") or getattr(config, "vision_aspect_ratio", None) or "anyres_max_9"
        may_shrink = shrinks and math.sqrt(max(tile_grids) / int(aspect.removeprefix("anyres_max_"))) > 1.1
        if (geometry_baked(image_sizes) or pixel_values.dim() != 5 or may_shrink
                or kwargs.get("batch_num_images") is not None):
            return original(self, pixel_values, image_sizes, *args, **kwargs)
        report_applied()
        images = _AnyresImages(image_sizes, pixel_values.shape[1])
        return original(self, pixel_values.flatten(0, 1), images, *args, **kwargs)

    return get_image_features


@register_patch(
    "dynamo", *(f"transformers.models.{module}.modeling_{module}.image_size_to_num_patches"
    for module, _ in _ANYRES_MODELS),
    model_side="image_size_to_num_patches (llava_next and copies) computes the tile count of every image as a "
               "tensor from image_sizes instead of per-image Python arithmetic on `.tolist()` values.",
)
def _patch_anyres_tiles_counted_together(original):
    """`_AnyresImages` reads as one image holding every image's tiles."""

    def image_size_to_num_patches(image_size, grid_pinpoints, patch_size):
        if isinstance(image_size, _AnyresImages):
            return image_size.sizes.shape[0] * image_size.tiles_per_image
        return original(image_size, grid_pinpoints, patch_size)

    return image_size_to_num_patches


@register_patch(
    "dynamo", *(f"transformers.models.{module}.modeling_{module}.{model}.pack_image_features"
    for module, model in _ANYRES_MODELS),
    model_side="LlavaNextModel.pack_image_features (and copies) unpads and lays out every image's grid at once "
               "with masks/gathers over tensor sizes instead of a Python loop over images.",
)
def _patch_anyres_packs_at_once(original):
    """Given `_AnyresImages`, every image is packed at once (`_anyres_packed`), as one part of the per-image list.
    Granite 4 Vision's pack returns the list alone, the others the lengths too."""
    with_lengths = not original.__qualname__.startswith("Granite4VisionModel.")

    def pack_image_features(self, image_features, image_sizes, *args, image_newline=None, **kwargs):
        if not isinstance(image_sizes, _AnyresImages):
            return original(self, image_features, image_sizes, *args, image_newline=image_newline, **kwargs)
        (tiles,) = image_features
        packed, lengths = _anyres_packed(tiles, image_sizes, self.config.image_grid_pinpoints,
                                         self.config.vision_config.image_size, image_newline)
        return ([packed], lengths) if with_lengths else [packed]

    return pack_image_features
