"""The Dynamo model patches of `exporters/dynamo/patches/placeholders.py` (placeholder checks): each passes with its
workaround and fails, or differs from eager, without it.
"""

import pytest
import torch

import exporters
from exporters.workarounds import disabled_workarounds

from .modules import (
    built_by_the_sweep,
    check_class_case,
    check_dynamic_cell_case,
    exported_on_the_varying_axes,
)


CLASS_CASES = [  # (model class, tiny as the sweep builds it, backend, workaround, error without it)
    ("HunYuanVLForConditionalGeneration", "dynamo", "_patch_hunyuan_vl_placeholder_check_as_tensor", "data-dep"),
    # its placeholder count checked against its image tokens in a Python `if`
    ("GlmImageModel", "dynamo", "_patch_glm_image_placeholder_check_as_tensor", "data-dependent"),
]


@pytest.mark.parametrize("name, backend, workaround, error", CLASS_CASES, ids=[case[2] for case in CLASS_CASES])
def test_a_model_class_exports_with_its_workaround_and_fails_without(name, backend, workaround, error):
    check_class_case(name, backend, workaround, error)


DYNAMIC_CELL_CASES = [  # (model class, backend, {workaround: (stage, message) of its dynamic cell without it})
    ("GlmImageModel", "dynamo",
     {"_patch_glm_image_source_grids_by_mask": ("dynamic-axes", "images_per_sample axis 0 = 2 (second set: 3)"),
      "_patch_glm_image_features_as_one_map": ("torch-export", "data-dependent")}),
]  # fmt: skip


@pytest.mark.parametrize("name, backend, failures", DYNAMIC_CELL_CASES, ids=[case[0] for case in DYNAMIC_CELL_CASES])
def test_a_dynamic_cell_passes_with_its_workarounds_and_fails_without_each(name, backend, failures):
    check_dynamic_cell_case(name, backend, failures)


@pytest.mark.parametrize("name", ["VoxtralModel", "InklingModel"])
def test_placeholder_checks_by_count_export_with_a_symbolic_batch(name):
    _context, _, export = exported_on_the_varying_axes(name, ["_patch_placeholder_count_checked_by_sum"])
    with disabled_workarounds("_patch_placeholder_count_checked_by_sum"):
        with pytest.raises(exporters.ExportError, match="not a subset of src_bound"):
            export()


def test_glm_image_source_grids_and_tokens_of_one_map_are_eagers_image_by_image():
    from transformers.models.glm_image.modeling_glm_image import GlmImageModel

    from exporters.dynamo.patches.placeholders import _patch_glm_image_features_as_one_map, _patch_glm_image_source_grids_by_mask

    context = built_by_the_sweep("GlmImageModel")
    model, inputs = context.model, context.inputs["A"]
    grids = torch.tensor([[1, 2, 2], [1, 4, 2], [1, 2, 2], [1, 2, 4], [1, 4, 4], [1, 2, 2]])
    per_sample = torch.tensor([2, 3, 1])  # the last grid of each sample is the image it generates
    by_mask = _patch_glm_image_source_grids_by_mask(GlmImageModel.get_image_grids_for_generation)
    torch.testing.assert_close(by_mask(model, per_sample, grids),
                               GlmImageModel.get_image_grids_for_generation(model, per_sample, grids))
    sources = grids[[0, 2, 3]]
    pixel_values = torch.randn(int(sources.prod(-1).sum()), inputs["pixel_values"].shape[-1])
    one_map = _patch_glm_image_features_as_one_map(GlmImageModel.get_image_features)
    with torch.no_grad():
        by_image = model.get_image_tokens(model.get_image_features(pixel_values, sources).pooler_output)
        at_once = model.get_image_tokens(one_map(model, pixel_values, sources).pooler_output)
    torch.testing.assert_close(at_once, by_image)
