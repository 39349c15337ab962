"""The Dynamo model patches of `exporters/dynamo/patches/keypoints.py` (keypoint detectors and matchers): each passes
with its workaround and fails, or differs from eager, without it.
"""

import pytest
import torch

import exporters
from exporters.workarounds import disabled_workarounds

from .modules import built_by_the_sweep, check_dynamic_cell_case, fixed_axes_with_and_without


DYNAMIC_CELL_CASES = [  # (model class, backend, {workaround: (stage, message) of its dynamic cell without it})
    # SuperPoint's keypoints, image by image, in the matcher's two images per pair; then the matcher's empty branch
    ("SuperGlueForKeypointMatching", "dynamo",
     {"_patch_superpoint_keypoints_of_every_image_at_once": ("torch-export", "Eq(Max(u1, u3, u5, u7), 0)"),
      "_patch_keypoint_matching_of_two_keypoints_or_more": ("torch-export", "Eq(u0, 0)")}),
]  # fmt: skip


@pytest.mark.parametrize("name, backend, failures", DYNAMIC_CELL_CASES, ids=[case[0] for case in DYNAMIC_CELL_CASES])
def test_a_dynamic_cell_passes_with_its_workarounds_and_fails_without_each(name, backend, failures):
    check_dynamic_cell_case(name, backend, failures)


@pytest.mark.parametrize("confidence_bias, layers_kept", [
    (2.2, {1, 2}),  # confident enough to prune at the first layer, not to stop: pairs go on with fewer keypoints
    (3.0, {1}),  # every pair stops at the first layer
])
def test_lightglue_stopping_and_pruning_by_masks_is_eagers(confidence_bias, layers_kept):
    """Eager's own LightGlue crashes when only some pairs stop before its last layer (it builds the last layer's
    stops for the whole batch), so the cases it runs: pruning without stopping, and every pair stopping at once."""
    from harness.cells import varying_axes

    context = built_by_the_sweep("LightGlueForKeypointMatching")
    model, first, second = context.model, context.inputs["A"], context.inputs["B"]
    with torch.no_grad():
        model.token_confidence[0].token.bias.fill_(confidence_bias)
        model.match_assignment_layers[0].matchability.bias.fill_(-5.0)  # unlikely to match: prunable when confident
        expected = {key: model(**inputs) for key, inputs in (("A", first), ("B", second))}
    assert {int(count) for count in expected["B"].prune.unique()} == layers_kept
    exporter, config = exporters.exporter_for("dynamo", dynamic=True, dynamic_shapes=varying_axes(first, second))
    exported = exporter.export(model, first, config)
    assert "_patch_lightglue_stops_and_prunes_by_masks" in exported.applied
    for key, inputs in (("A", first), ("B", second)):
        got = exported(**inputs)
        for name in ("matches", "matching_scores", "prune"):
            torch.testing.assert_close(got[name], expected[key][name], atol=1e-6, rtol=1e-6)
    if confidence_bias == 3.0:
        return
    with disabled_workarounds("_patch_lightglue_stops_and_prunes_by_masks"):
        with pytest.raises(exporters.ExportError, match="data-dependent"):
            exporter.export(model, first, config)


def test_superpoint_keypoints_at_once_are_eagers_image_by_image():
    """Every image's keypoints, scores and descriptors at once, as eager pads them: all of each image's keypoints,
    or the best `max_keypoints` where some images have more; and the batch stays symbolic."""
    from exporters.dynamo.patches.keypoints import _superpoint_keypoints_at_once

    model = built_by_the_sweep("SuperPointForKeypointDetection").model
    with torch.no_grad():
        model.keypoint_decoder.conv_score_b.weight.mul_(10)  # scores apart, below saturation: no ties to break
    pixel_values = torch.randn(4, 3, 40, 48, generator=torch.Generator().manual_seed(0))
    counts = []
    for most in (-1, 5, 28):
        model.keypoint_decoder.max_keypoints = most
        with torch.no_grad():
            by_image, at_once = model(pixel_values), _superpoint_keypoints_at_once(model, pixel_values)
        for name in ("keypoints", "scores", "descriptors", "mask"):
            torch.testing.assert_close(getattr(at_once, name), getattr(by_image, name), msg=name)
        counts.append(by_image.mask.sum(1).tolist())
    assert counts[1] == [5] * 4 and min(counts[0]) < 28 < max(counts[0]), counts  # cut, and cut for some images
    fixed = fixed_axes_with_and_without("SuperPointForKeypointDetection",
                                         ["_patch_superpoint_keypoints_of_every_image_at_once"])
    assert "pixel_values axis 0 = 2 (second set: 3)" in fixed["_patch_superpoint_keypoints_of_every_image_at_once"]
