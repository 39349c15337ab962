"""The Dynamo model patches of `exporters/dynamo/patches/images.py` (images of several sizes in one batch): each passes
with its workaround and fails, or differs from eager, without it.
"""

import pytest
import torch

import exporters
from exporters.registration import apply_patches
from exporters.workarounds import disabled_workarounds

from ..conftest import TOLERANCE, assert_parity
from .modules import (
    ANYRES_PINPOINTS,
    ANYRES_SIZES,
    anyres_features,
    built_by_the_sweep,
    check_axes_stay_dynamic,
    check_dynamic_cell_case,
)


DYNAMIC_CELL_CASES = [  # (model class, backend, {workaround: (stage, message) of its dynamic cell without it})
    # resizes its position grid image by image: the batch is fixed to the traced one
    ("Siglip2VisionModel", "dynamo",
     {"_patch_siglip2_positions_resized_as_tensors": ("dynamic-axes", "spatial_shapes axis 0 = 2 (second set: 3)")}),
    ("Lfm2VlModel", "dynamo",
     {"_patch_lfm2_vl_images_projected_at_once": ("dynamic-axes", "spatial_shapes axis 0 = 2 (second set: 3)")}),
]  # fmt: skip


@pytest.mark.parametrize("name, backend, failures", DYNAMIC_CELL_CASES, ids=[case[0] for case in DYNAMIC_CELL_CASES])
def test_a_dynamic_cell_passes_with_its_workarounds_and_fails_without_each(name, backend, failures):
    check_dynamic_cell_case(name, backend, failures)


DYNAMIC_CASES = [  # (model class, workaround, the input whose axis it keeps dynamic)
    ("LlavaForConditionalGeneration", "_patch_llava_features_as_one_image", "pixel_values"),  # a list per image
]


@pytest.mark.parametrize("name, workaround, input_name", DYNAMIC_CASES, ids=[case[1] for case in DYNAMIC_CASES])
def test_a_model_keeps_its_axes_dynamic_with_its_workaround(name, workaround, input_name):
    check_axes_stay_dynamic(name, workaround, input_name)


def test_siglip2_positions_resized_as_tensors_are_eagers_for_every_grid():
    from transformers.models.siglip2.modeling_siglip2 import Siglip2VisionEmbeddings

    from exporters.dynamo.patches.images import _patch_siglip2_positions_resized_as_tensors

    original = Siglip2VisionEmbeddings.resize_positional_embeddings
    resized = _patch_siglip2_positions_resized_as_tensors(original)
    generator = torch.Generator().manual_seed(0)
    for side in (4, 7):  # grids shrunk, kept and grown, each image its own, with padding
        grid = torch.randn(side, side, 8, generator=generator)
        for _ in range(10):
            # torch's CPU kernel gives a resize to width 1 one value per column; widths start at 2
            shapes = torch.stack([torch.randint(1, 3 * side, (3,), generator=generator),
                                  torch.randint(2, 3 * side, (3,), generator=generator)], dim=1)
            length = int(shapes.prod(-1).max()) + 3
            torch.testing.assert_close(resized(grid, shapes, length), original(grid, shapes, length))


def test_lfm2_vl_images_projected_at_once_are_eagers_image_by_image():
    from harness.cells import ClassContext
    from harness.models import select

    from exporters.dynamo.patches.images import _patch_lfm2_vl_images_projected_at_once

    model = ClassContext(select("Lfm2VlModel")[0]).prepare().model
    original = type(model).get_image_features
    shapes = torch.tensor([[4, 6], [2, 2], [6, 4]])  # patch grids of three images, padded to 24 patches
    mask = (torch.arange(24)[None] < shapes.prod(-1)[:, None]).long()
    pixels = torch.randn(3, 24, model.config.vision_config.num_channels * model.config.vision_config.patch_size**2)
    with torch.no_grad():
        at_once = _patch_lfm2_vl_images_projected_at_once(original)(model, pixels, shapes, mask).pooler_output
        one_by_one = original(model, pixels, shapes, mask).pooler_output
    torch.testing.assert_close(torch.cat(at_once), torch.cat(one_by_one))


@pytest.mark.parametrize("name", ["LlavaNextModel", "LlavaOnevisionModel", "Granite4VisionModel"])
def test_anyres_images_packed_at_once_are_eagers_image_by_image(name):

    model = built_by_the_sweep(name).model
    model.config.image_grid_pinpoints = ANYRES_PINPOINTS
    tile = model.config.vision_config.image_size
    pixel_values = torch.randn(len(ANYRES_SIZES), 9, 3, tile, tile)  # up to 8 tiles and the overview
    module = type(model).__module__
    with torch.no_grad():
        by_image = anyres_features(model.get_image_features(pixel_values, ANYRES_SIZES))
        with apply_patches("dynamo", select=lambda path: path.startswith(module + ".")):
            at_once = anyres_features(model.get_image_features(pixel_values, ANYRES_SIZES))
    assert len(at_once) == len(by_image)
    for ours, eagers in zip(at_once, by_image):
        torch.testing.assert_close(ours, eagers)


def test_anyres_images_keep_their_count_and_sizes_symbolic():
    """Exported on two images, run on five of other sizes that pick other grids; without the patch the trace
    stops on the sizes' values."""
    context = built_by_the_sweep("LlavaNextModel")
    model, config = context.model, context.model.config
    config.image_grid_pinpoints = ANYRES_PINPOINTS
    tile = config.vision_config.image_size

    def inputs(sizes):
        pixel_values = torch.randn(len(sizes), 9, 3, tile, tile)
        with torch.no_grad():
            lengths = [len(part) for part in model.get_image_features(pixel_values, sizes).pooler_output]
        text = max(lengths) + 3
        input_ids = torch.tensor([[config.image_token_id] * n + [1] * (text - n) for n in lengths])
        return {"input_ids": input_ids, "pixel_values": pixel_values, "image_sizes": sizes}

    first, second = inputs(ANYRES_SIZES[:2]), inputs(ANYRES_SIZES[2:])
    axes = {"input_ids": {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO},
            "pixel_values": {0: torch.export.Dim.AUTO}, "image_sizes": {0: torch.export.Dim.AUTO}}
    exporter, export_config = exporters.exporter_for("dynamo", dynamic=True, dynamic_shapes=axes)
    exported = exporter.export(model, first, export_config)
    assert "_patch_anyres_images_packed_at_once" in exported.applied
    with torch.no_grad():
        expected = exporters.named_leaves(model(**second))
    assert_parity(exported(**second), expected, TOLERANCE["dynamo"])
    with disabled_workarounds("_patch_anyres_images_packed_at_once"), pytest.raises(
            exporters.ExportError, match="data-dependent"):
        exporter.export(model, first, export_config)
