"""The Dynamo model patches of `exporters/dynamo/patches/vision_patches.py` (vision towers' patch crops, merges and
positions): each passes with its workaround and fails, or differs from eager, without it.
"""

import pytest
import torch

import exporters
from exporters.workarounds import disabled_workarounds

from .modules import (
    PositionedPatches,
    WindowOrdered,
    built_by_the_sweep,
    check_dynamic_cell_case,
    exported_on_the_varying_axes,
    fixed_axes_with_and_without,
)


DYNAMIC_CELL_CASES = [  # (model class, backend, {workaround: (stage, message) of its dynamic cell without it})
    # crops each image's tokens to its size, image by image
    ("Emu3Model", "dynamo", {"_patch_emu3_image_tokens_cropped_at_once": ("torch-export", "data-dependent")}),
]  # fmt: skip


@pytest.mark.parametrize("name, backend, failures", DYNAMIC_CELL_CASES, ids=[case[0] for case in DYNAMIC_CELL_CASES])
def test_a_dynamic_cell_passes_with_its_workarounds_and_fails_without_each(name, backend, failures):
    check_dynamic_cell_case(name, backend, failures)


def test_vision_positions_at_once_are_eagers_image_by_image_and_keep_the_image_count_symbolic():
    from transformers.models.muse_spark.modeling_muse_spark import get_vision_position_ids

    from exporters.dynamo.patches.vision_patches import _patch_vision_positions_at_once

    at_once = _patch_vision_positions_at_once(get_vision_position_ids)
    grids = torch.tensor([[1, 4, 6], [2, 2, 2], [1, 6, 4], [3, 2, 4]])  # images, and videos of 2 and 3 frames
    for merge, temporal in ((1, False), (2, False), (2, True)):
        torch.testing.assert_close(at_once(grids, merge, temporal), get_vision_position_ids(grids, merge, temporal))
    # ColQwen2 calls its Qwen2-VL tower directly, merge size 2: nothing precomputed reaches it
    fixed = fixed_axes_with_and_without("ColQwen2ForRetrieval", ["_patch_vision_positions_at_once"])
    assert "image_grid_thw axis 0 = 2 (second set: 3)" in fixed["_patch_vision_positions_at_once"]


def test_executorch_plans_vision_positions_for_any_image_count():
    # no list of frames: its length, read from the data, would have no upper bound to plan memory for
    model = PositionedPatches().eval()
    exporter, config = exporters.exporter_for("executorch", dynamic=True)
    inputs = {"patches": torch.randn(20, 3), "grid_thw": torch.tensor([[1, 2, 2], [2, 2, 4]])}
    exported = exporter.export(model, inputs, config)
    other = {"patches": torch.randn(16, 3), "grid_thw": torch.tensor([[1, 2, 2], [1, 2, 2], [2, 2, 2]])}
    (got,) = exported(**other).values()
    torch.testing.assert_close(got, model(**other))


def test_pixtral_patches_and_mistral3_blocks_picked_at_once_are_eagers_image_by_image():
    from harness.cells import ClassContext
    from harness.models import select

    from exporters.dynamo.patches.vision_patches import _patch_patch_merger_blocks_gathered, _patch_pixtral_patches_picked_at_once

    model = ClassContext(select("Mistral3Model")[0]).prepare().model
    tower, merger = model.vision_tower, model.multi_modal_projector.patch_merger
    sizes = torch.tensor([[4, 6], [3, 2], [6, 5]]) * tower.patch_size  # odd grids lose a row or column of blocks
    pixels = torch.randn(3, tower.config.num_channels, 6 * tower.patch_size, 6 * tower.patch_size)
    with torch.no_grad():
        one_by_one = tower(pixels, image_sizes=sizes.tolist()).last_hidden_state
        at_once = _patch_pixtral_patches_picked_at_once(type(tower).forward)(tower, pixels, sizes).last_hidden_state
        torch.testing.assert_close(at_once, one_by_one)
        merged = _patch_patch_merger_blocks_gathered(type(merger).forward)(merger, one_by_one[0], sizes)
        torch.testing.assert_close(merged, merger(one_by_one[0], sizes.tolist()))


def test_a_static_export_computes_the_window_order_of_its_baked_image_sizes():
    model = WindowOrdered().eval()
    inputs = {"hidden_states": torch.randn(1, 24, 4), "target_sizes": torch.tensor([[4, 4], [2, 4]])}
    exporter, config = exporters.exporter_for("executorch")
    exported = exporter.export(model, inputs, config)
    assert "_patch_whole_windows_at_once" in exported.applied
    for got, want in zip(exported(**inputs).values(), model(**inputs), strict=True):
        assert torch.equal(got, want)
    with disabled_workarounds("_patch_whole_windows_at_once"), pytest.raises(exporters.ExportError, match="data-dep"):
        exporter.export(model, inputs, config)  # traced, the order's boolean indexing leaves lengths unknown


def test_paddleocr_projector_blocks_gathered_are_eagers_image_by_image():
    from exporters.dynamo.patches.vision_patches import _patch_paddleocr_projector_blocks_gathered

    projector = built_by_the_sweep("PaddleOCRVLModel").model.projector
    grids = torch.tensor([[1, 4, 6], [2, 2, 4], [1, 6, 2]])  # images, and a video of 2 frames
    features = torch.randn(int(grids.prod(-1).sum()), projector.pre_norm.normalized_shape[0])
    gathered = _patch_paddleocr_projector_blocks_gathered(type(projector).forward)
    with torch.no_grad():
        torch.testing.assert_close(gathered(projector, features, grids), projector(features, grids))
    fixed = fixed_axes_with_and_without("PaddleOCRVLModel", ["_patch_paddleocr_projector_blocks_gathered"])
    assert "image_grid_thw axis 0 = 2 (second set: 3)" in fixed["_patch_paddleocr_projector_blocks_gathered"]


@pytest.mark.parametrize("name", ["DeepseekOcr2Model", "UnlimitedOcrModel", "Step3p7Model"])
def test_global_views_laid_out_at_once_are_eagers_image_by_image(name):
    from exporters.dynamo.patches.vision_patches import _global_views_at_once

    context = built_by_the_sweep(name)
    pixel_values = context.inputs["B"]["pixel_values"]  # three images
    with torch.no_grad():
        by_image = context.model.get_image_features(pixel_values).pooler_output
        at_once = _global_views_at_once(context.model, pixel_values).pooler_output
    assert len(by_image) == 3 and len(at_once) == 1
    torch.testing.assert_close(at_once[0], torch.cat(by_image))


def test_global_views_at_once_keep_the_image_count_symbolic():
    fixed = fixed_axes_with_and_without("DeepseekOcr2Model", ["_patch_global_views_laid_out_at_once"])
    assert "pixel_values axis 0 = 2 (second set: 3)" in fixed["_patch_global_views_laid_out_at_once"]


def test_cosmos3_edge_positions_resized_at_once_are_eagers_frame_by_frame():
    from transformers.models.cosmos3_edge.modeling_cosmos3_edge import Cosmos3EdgeVisionEmbeddings

    from exporters.dynamo.patches.vision_patches import _patch_cosmos3_edge_positions_resized_at_once

    original = Cosmos3EdgeVisionEmbeddings.resize_positional_embeddings
    at_once = _patch_cosmos3_edge_positions_resized_at_once(original)
    table = torch.randn(6, 6, 8, generator=torch.Generator().manual_seed(0))
    grids = torch.tensor([[1, 4, 6], [2, 2, 2], [1, 8, 4], [3, 6, 10]])  # shrunk and grown, videos of 2 and 3 frames
    for merge in (1, 2):
        torch.testing.assert_close(at_once(table, grids, merge), original(table, grids, merge))
    workaround = "_patch_cosmos3_edge_positions_resized_at_once"
    _, _, export = exported_on_the_varying_axes("Cosmos3EdgeVisionModel", [workaround])
    with disabled_workarounds(workaround), pytest.raises(
            exporters.ExportError, match="data-dependent"):
        export()


def test_minicpm_positions_windows_and_merger_at_once_are_eagers_image_by_image():
    from transformers.models.minicpmv4_6 import modeling_minicpmv4_6 as minicpm

    from exporters.dynamo.patches.vision_patches import _patch_minicpm_merger_blocks_gathered, _patch_nearest_positions_at_once, _patch_whole_windows_at_once

    sizes = torch.tensor([[8, 12], [4, 4], [12, 8]])  # whole windows and merge blocks, two rounds deep
    positions = _patch_nearest_positions_at_once(minicpm.get_vision_nearest_position_ids)
    torch.testing.assert_close(positions(sizes, 5), minicpm.get_vision_nearest_position_ids(sizes, 5))
    grid = torch.nn.functional.pad(sizes, (1, 0), value=1)
    windows = _patch_whole_windows_at_once(minicpm.get_vision_window_index)
    for ours, eagers in zip(windows(grid, 1, 2, 1), minicpm.get_vision_window_index(grid, 1, 2, 1)):
        torch.testing.assert_close(ours, eagers, check_dtype=False)
    config = built_by_the_sweep("MiniCPMV4_6ForConditionalGeneration").model.config
    config.merger_times = 2  # the tiny model folds once
    merger = minicpm.MiniCPMV4_6Merger(config).eval()
    features = torch.randn(1, int(sizes.prod(-1).sum()), merger.mlp[0].pre_norm.normalized_shape[0] // 4)
    with torch.no_grad():
        (gathered,) = _patch_minicpm_merger_blocks_gathered(type(merger).forward)(merger, features, sizes)
        torch.testing.assert_close(gathered, torch.cat(merger(features, sizes)))


def test_emu3_image_tokens_cropped_at_once_are_eagers_image_by_image():
    from transformers.models.emu3.modeling_emu3 import Emu3Model

    from exporters.dynamo.patches.vision_patches import _patch_emu3_image_tokens_cropped_at_once

    model = built_by_the_sweep("Emu3Model").model
    side = 32
    factor = model.vqmodel.vision_spatial_factor
    # whole, rows cropped, columns cropped, both
    sizes = torch.tensor([[side, side], [side // 2, side], [side, side - factor], [factor, factor]])
    pixel_values = torch.randn(len(sizes), 3, side, side, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        by_image = Emu3Model.get_image_features(model, pixel_values, sizes).pooler_output
        at_once = _patch_emu3_image_tokens_cropped_at_once(Emu3Model.get_image_features)(model, pixel_values, sizes)
    torch.testing.assert_close(at_once.pooler_output[0], torch.cat(by_image))
