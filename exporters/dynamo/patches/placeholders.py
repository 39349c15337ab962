"""Stage 2 model patches: placeholder tokens checked against image or audio features by Python `if`s on tensor values:
HunYuan-VL, GLM-Image, Voxtral, Inkling.
"""

from __future__ import annotations

import inspect

import torch

from ...registration import register_patch, report_applied
from .grids import geometry_baked


# ── Stage 2: Model patches ───────────────────────────────────────────────────


@register_patch(
    "dynamo", "transformers.models.hunyuan_vl.modeling_hunyuan_vl.HunYuanVLModel.get_placeholder_mask",
    model_side="HunYuanVLModel.get_placeholder_mask checks the placeholder count against the image features with"
               " torch_compilable_check / torch._check_tensor_all, as transformers' other VLMs do, instead of a "
               "Python `if` on the size of a boolean selection.",
)
def _patch_hunyuan_vl_placeholder_check_as_tensor(original):
    """HunYuan-VL compares its placeholder count with its image features by a Python `if` on the size of a
    boolean selection, a branch on tensor values. The same check as a tensor condition, as transformers' other
    vision-language models make it (`torch._check_tensor_all`)."""

    def get_placeholder_mask(self, input_ids, inputs_embeds, image_features=None):
        mask = original(self, input_ids, inputs_embeds)
        if image_features is not None:
            torch._check_tensor_all(mask.sum() == image_features.numel(),
                                    lambda: "Image features and image tokens do not match")
        return mask

    return get_placeholder_mask


@register_patch(
    "dynamo", "transformers.models.glm_image.modeling_glm_image.GlmImageModel"
    ".get_image_grids_for_generation", reports=True,
    model_side="GlmImageModel.get_image_grids_for_generation drops each sample's last (generated) grid with one "
               "boolean/index mask computed from `images_per_sample` instead of splitting by "
               "`images_per_sample.tolist()`.",
)
def _patch_glm_image_source_grids_by_mask(original):
    """GLM-Image drops each sample's last grid (the image it generates) by splitting the grids by
    `images_per_sample.tolist()`: it fixes the sample and image counts. The same rows kept by one mask."""

    def get_image_grids_for_generation(self, images_per_sample, image_grid_thw):
        if images_per_sample is None or geometry_baked(images_per_sample):
            return original(self, images_per_sample, image_grid_thw)
        report_applied()
        last = images_per_sample.cumsum(0) - 1
        row = torch.arange(image_grid_thw.shape[0], device=image_grid_thw.device)
        return image_grid_thw[~(row[:, None] == last).any(-1)]

    return get_image_grids_for_generation


@register_patch(
    "dynamo", "transformers.models.glm_image.modeling_glm_image.GlmImageModel.get_image_features",
    reports=True,
    model_side="GlmImageModel.get_image_features runs its VQ tokenizer over all images' cells as one map (it is "
               "per-cell: 1x1 conv then nearest code) instead of splitting features by `.tolist()` sizes and "
               "tokenizing image by image.",
)
def _patch_glm_image_features_as_one_map(original):
    """GLM-Image lays each image's features out as its own map, split by `.tolist()` sizes, and its VQ tokenizer
    runs on each map in turn: the image count is fixed. The tokenizer works cell by cell (a 1x1 convolution, then
    the nearest code): every image's cells, in the same order, as one map of one row."""
    from transformers.utils.generic import accepts_precomputed_kwargs, can_return_tuple

    def get_image_features(self, pixel_values, image_grid_thw=None, images_per_sample=None, **kwargs):
        baked = not isinstance(image_grid_thw, torch.Tensor) or geometry_baked(image_grid_thw)
        if baked or images_per_sample is not None:
            return inspect.unwrap(original)(self, pixel_values, image_grid_thw, images_per_sample, **kwargs)
        report_applied()
        torch._check_tensor_all((image_grid_thw[:, 0] == 1).all(), lambda: "GLM-Image's maps are of one frame")
        outputs = self.visual(pixel_values.type(self.visual.dtype), grid_thw=image_grid_thw, return_dict=True,
                              **kwargs)
        outputs.pooler_output = outputs.pooler_output.T[None, :, None]  # (1, channels, 1, cells)
        return outputs

    return accepts_precomputed_kwargs(modality="image")(can_return_tuple(get_image_features))


@register_patch(
    "dynamo", "transformers.models.glm_image.modeling_glm_image.GlmImageModel.get_placeholder_mask",
    model_side="GlmImageModel.get_placeholder_mask checks the placeholder count against the image tokens with "
               "torch_compilable_check / torch._check_tensor_all instead of a Python `if` on a tensor value.",
)
def _patch_glm_image_placeholder_check_as_tensor(_original):
    """GLM-Image checks its placeholder count against its image tokens with a Python `if` on a tensor's value, as
    HunYuan-VL does (see `_patch_hunyuan_vl_placeholder_check_as_tensor`): the same check as a tensor condition."""

    def get_placeholder_mask(self, input_ids, image_ids):
        mask = input_ids == self.config.image_token_id
        torch._check_tensor_all(mask.sum() == image_ids.shape[0],
                                lambda: "Number of image placeholder tokens does not match the image tokens")
        return mask

    return get_placeholder_mask


@register_patch(
    "dynamo",
    "transformers.models.voxtral.modeling_voxtral.VoxtralModel.get_placeholder_mask",
    "transformers.models.inkling.modeling_inkling.InklingModel.get_placeholder_mask",
    "transformers.models.inkling2.modeling_inkling2.Inkling2Model.get_placeholder_mask",
    reports=True,
    model_side="VoxtralModel / InklingModel / Inkling2Model.get_placeholder_mask check `mask.sum() * hidden_size"
               " == features.numel()` as a tensor condition (torch_compilable_check) instead of comparing the "
               "size of a boolean selection, which with a symbolic batch trips torch's range bookkeeping.",
)
def _patch_placeholder_count_checked_by_sum(original):
    """Voxtral and Inkling (1 and 2) check their placeholders against their features by the size of a boolean selection:
    with a symbolic batch, equating that data-dependent size with the features' size trips torch's range
    bookkeeping ("not a subset of src_bound"). The count of placeholders times the width is that size: the same
    check as a tensor condition, as in `_patch_hunyuan_vl_placeholder_check_as_tensor`."""

    def get_placeholder_mask(self, input_ids, inputs_embeds, *args, **kwargs):
        if input_ids is None:  # placeholders found by their embedding: no selection to size
            return original(self, input_ids, inputs_embeds, *args, **kwargs)
        report_applied()
        # Voxtral's (audio_features) and Inkling's (features, token_id), by position or by name
        features = kwargs.get("audio_features", kwargs.get("features", args[0] if args else None))
        token = kwargs.get("token_id", args[1] if len(args) > 1 else self.config.audio_token_id)
        mask = input_ids == token
        torch._check_tensor_all(mask.sum() * inputs_embeds.shape[-1] == features.numel(),
                                lambda: "Multimodal features and placeholder tokens do not match")
        return mask.unsqueeze(-1).expand_as(inputs_embeds)

    return get_placeholder_mask
