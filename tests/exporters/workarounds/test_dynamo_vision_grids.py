"""The Dynamo model patches of `exporters/dynamo/patches/vision_grids.py` (vision towers walking their image grids):
each passes with its workaround and fails, or differs from eager, without it.
"""

import types

import pytest
import torch

from exporters.registration import apply_patches
from exporters.workarounds import disabled_workarounds

from .modules import (
    built_by_the_sweep,
    check_class_case,
    check_dynamic_cell_case,
    exported_on_the_varying_axes,
)


CLASS_CASES = [  # (model class, tiny as the sweep builds it, backend, workaround, error without it)
    ("UdopForConditionalGeneration", "onnx", "_patch_udop_patches_as_fixed_rows", "data is not allocated"),
]


@pytest.mark.parametrize("name, backend, workaround, error", CLASS_CASES, ids=[case[2] for case in CLASS_CASES])
def test_a_model_class_exports_with_its_workaround_and_fails_without(name, backend, workaround, error):
    check_class_case(name, backend, workaround, error)


DYNAMIC_CELL_CASES = [  # (model class, backend, {workaround: (stage, message) of its dynamic cell without it})
    # its blocks counted from the data: ExecuTorch plans memory for them only bounded by the patches given
    ("VideoLlama3VisionModel", "executorch",
     {"_patch_video_llama3_blocks_shrunk_at_once": ("torch-export", "Could not guard on data-dependent")}),
    # pairs its videos' frames in Python ranges of their frame counts
    ("Ernie4_5_VLMoeModel", "dynamo", {"_patch_ernie_vl_frame_pairs_at_once": ("torch-export", "data-dependent")}),
    ("VideoLlama3Model", "dynamo",
     {"_patch_video_llama3_blocks_shrunk_at_once": ("torch-export", "data-dependent")}),
    ("HunYuanVLVisionTransformer", "dynamo",
     {"_patch_hunyuan_vl_images_merged_at_once": ("dynamic-axes", "grid_thw axis 0 = 2 (second set: 3)"),
      "_patch_hunyuan_vl_positions_resized_at_once": ("dynamic-axes", "grid_thw axis 0 = 2 (second set: 3)")}),
]  # fmt: skip


@pytest.mark.parametrize("name, backend, failures", DYNAMIC_CELL_CASES, ids=[case[0] for case in DYNAMIC_CELL_CASES])
def test_a_dynamic_cell_passes_with_its_workarounds_and_fails_without_each(name, backend, failures):
    check_dynamic_cell_case(name, backend, failures)


def test_lfm3_vl_convolution_by_neighbours_is_eagers_frame_by_frame():
    from transformers.models.lfm3_vl.modeling_lfm3_vl import Lfm3VlVisionShortConv

    from exporters.dynamo.patches.vision_grids import _patch_lfm3_vl_convolution_by_neighbours
    from exporters.dynamo.patches.lengths import WholeSplit

    model = built_by_the_sweep("Lfm3VlModel").model
    conv = next(module for module in model.modules() if isinstance(module, Lfm3VlVisionShortConv))
    merge = conv.spatial_merge_size
    grids = torch.tensor([[1, 2, 3], [2, 3, 1], [1, 1, 2]]) * torch.tensor([1, merge, merge])  # a video of 2 frames
    hidden = torch.randn(int(grids.prod(-1).sum()), conv.in_proj.in_features)
    by_neighbours = _patch_lfm3_vl_convolution_by_neighbours(type(conv).forward)
    with torch.no_grad():
        torch.testing.assert_close(by_neighbours(conv, hidden, WholeSplit(grids)), conv(hidden, grids.tolist()))
    _, _, export = exported_on_the_varying_axes("Lfm3VlVisionModel", ["_patch_lfm3_vl_convolution_by_neighbours"])
    with disabled_workarounds("_patch_lfm3_vl_convolution_by_neighbours"), pytest.raises(Exception, match="symbolic"):
        export()  # the grid the tower hands its layers stays a symbolic count, which the loop cannot iterate


def test_ernie_vl_frame_pairs_at_once_are_eagers_image_by_image():
    from transformers.models.ernie4_5_vl_moe.modeling_ernie4_5_vl_moe import (
        Ernie4_5_VLMoeVariableResolutionResamplerModel as Resampler,
    )

    from exporters.dynamo.patches.vision_grids import _patch_ernie_vl_frame_pairs_at_once

    resampler = types.SimpleNamespace(spatial_merge_size=2)
    grids = torch.tensor([[1, 4, 6], [2, 2, 2], [3, 4, 2], [4, 2, 4]])  # an image; videos of 2, 3 (odd) and 4 frames
    hidden_states = torch.randn(int(grids.prod(-1).sum()) // 4, 8)
    at_once = _patch_ernie_vl_frame_pairs_at_once(Resampler._temporal_slicing)(resampler, hidden_states, grids)
    torch.testing.assert_close(at_once, Resampler._temporal_slicing(resampler, hidden_states, grids))


def test_video_llama3_blocks_shrunk_at_once_are_eagers_image_by_image():
    from transformers.models.video_llama_3.modeling_video_llama_3 import VideoLlama3VisionModel

    from exporters.dynamo.patches.vision_grids import _patch_video_llama3_blocks_shrunk_at_once

    original = VideoLlama3VisionModel.pixel_unshuffle
    grids = torch.tensor([[1, 4, 6], [2, 4, 4], [1, 6, 6], [3, 2, 4]])  # images and videos of 2 and 3 frames
    merges = torch.tensor([1, 2, 3, 2])  # kept, the middle four of each block, its middle one
    hidden_states = torch.randn(int(grids.prod(-1).sum()), 8)
    at_once = _patch_video_llama3_blocks_shrunk_at_once(original)(None, hidden_states, grids, merges)
    torch.testing.assert_close(at_once, original(None, hidden_states, grids, merges))


def test_hunyuan_vl_positions_and_merged_images_at_once_are_eagers_image_by_image():

    tower = built_by_the_sweep("HunYuanVLVisionTransformer").model
    grids = torch.tensor([[1, 4, 6], [1, 6, 4], [1, 2, 2], [1, 5, 7]])  # odd sides lose a row or column of blocks
    pixel_values = torch.randn(int(grids.prod(-1).sum()), 3 * tower.config.patch_size**2)
    with torch.no_grad():
        by_image = tower(pixel_values, grids)
        with apply_patches("dynamo", select=lambda path: ".modeling_hunyuan_vl.HunYuanVLVision" in path):
            at_once = tower(pixel_values, grids)
    assert set(at_once) == set(by_image) == {"last_hidden_state", "pooler_output"}
    for name in by_image:
        torch.testing.assert_close(at_once[name], by_image[name], msg=name)


def test_radio_packed_images_and_nemotron_h_omni_shuffle_at_once_are_eagers_image_by_image():
    from exporters.dynamo.patches.vision_grids import _patch_nemotron_h_omni_images_shuffled_at_once, _patch_radio_packed_images_at_once

    model = built_by_the_sweep("NemotronH_Omni_Reasoning_V3").model
    embeddings = model.vision_model.embeddings
    grids = torch.tensor([[2, 2], [2, 4], [6, 4], [4, 4]])  # positions resized to 2, 4 and 6 and cropped
    pixel_values = torch.randn(int(grids.prod(-1).sum()), embeddings.patch_projection.in_features)
    embed = type(embeddings)._embed_packed_patches
    with torch.no_grad():
        at_once = _patch_radio_packed_images_at_once(embed)(embeddings, pixel_values, grids)
        torch.testing.assert_close(at_once, embed(embeddings, pixel_values, grids))
        features = type(model).get_image_features
        by_image = features(model, pixel_values, grids).pooler_output
        shuffled = _patch_nemotron_h_omni_images_shuffled_at_once(features)(model, pixel_values, grids).pooler_output
    torch.testing.assert_close(shuffled[0], torch.cat(by_image))
