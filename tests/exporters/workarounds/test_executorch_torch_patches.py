"""The ExecuTorch workarounds of `exporters/executorch/torch_patches.py` (stage 2, torch patches): each passes with its
workaround and fails, or differs from eager, without it.
"""

import pytest
import torch

import exporters
from exporters.registration import apply_patches
from exporters.workarounds import disabled_workarounds

from .modules import (
    AntialiasedResize,
    InterpolationTaps,
    KeySample,
    PatchIndexPerImage,
    PatchMaxima,
    PatchPositions,
    RowsOfSamples,
    SegmentMeans,
    SegmentMinimum,
    Tubelets,
    VideoConvolution,
    assert_runs_like_eager,
    check_class_case,
    check_pattern_case,
    check_runtime_case,
    executorch_dynamic,
)


CLASS_CASES = [  # (model class, tiny as the sweep builds it, backend, workaround, error without it)
    ("FNetForMaskedLM", "executorch", "_patch_fnet_fourier_as_matmul", "_fft_c2c.default is not in Core ATen"),
]


@pytest.mark.parametrize("name, backend, workaround, error", CLASS_CASES, ids=[case[2] for case in CLASS_CASES])
def test_a_model_class_exports_with_its_workaround_and_fails_without(name, backend, workaround, error):
    check_class_case(name, backend, workaround, error)


RUNTIME_CASES = [  # (module, inputs, workaround, what the ExecuTorch runtime says without it)
    (InterpolationTaps, {"indices": torch.randint(0, 16, (5, 4)), "weights": torch.rand(5, 4)},
     "_patch_embedding_bag_as_gather", "no kernel for aten::_embedding_bag"),
    (SegmentMinimum, {"values": torch.randn(7), "segments": torch.tensor([0, 2, 2, 4, 0, 2, 1])},
     "_patch_scatter_reduce_as_dense", "no kernel for aten::scatter_reduce"),
    (SegmentMeans, {"values": torch.randn(7), "segments": torch.tensor([0, 2, 2, 4, 0, 2, 1])},
     "_patch_scatter_reduce_as_dense", "no kernel for aten::scatter_reduce"),
    (PatchMaxima, {"states": torch.randn(2, 6, 3), "patches": torch.tensor([[0, 0, 1, 1, 3, 3], [0, 1, 1, 1, 1, 3]])},
     "_patch_scatter_reduce_as_dense", "no kernel for aten::scatter_reduce"),
    (VideoConvolution, {"video": torch.randn(2, 4, 5, 8, 8)}, "_patch_conv3d_as_frames_of_conv2d", "0x12"),
]  # fmt: skip


@pytest.mark.parametrize("module, inputs, workaround, error", RUNTIME_CASES, ids=[c[2] for c in RUNTIME_CASES])
def test_a_pattern_the_executorch_runtime_cannot_run_is_rewritten(module, inputs, workaround, error):
    check_runtime_case(module, inputs, workaround, error)


MODULE_CASES = [  # (backend, module, inputs, workaround, error without it)
    ("executorch", PatchPositions, {"coordinates": torch.tensor([[-1.0, 0.0, 0.1, 0.25, 0.3, 0.75, 0.9, 1.0]])},
     "_patch_bucketize_as_comparison", "bucketize.Tensor is not in Core ATen"),
    ("executorch", PatchIndexPerImage, {"patches": torch.randn(5, 3), "patches_per_image": torch.tensor([2, 3])},
     "_patch_repeat_interleave_as_gather", "repeat_interleave.Tensor is not in Core ATen"),
    ("executorch", RowsOfSamples,
     {"sample_lengths": torch.tensor([3, 1, 4]), "row_starts": torch.tensor([0.0, 3, 3.5, 4, 7])},
     "_patch_searchsorted_as_comparison", "searchsorted.Tensor is not in Core ATen"),
]  # fmt: skip


@pytest.mark.parametrize("backend, module, inputs, workaround, error", MODULE_CASES, ids=[c[3] for c in MODULE_CASES])
def test_a_traced_pattern_exports_with_its_workaround_and_fails_without(backend, module, inputs, workaround, error):
    check_pattern_case(backend, module, inputs, workaround, error)


def test_executorch_antialiased_bicubic_resize_as_matrix_products():
    model = AntialiasedResize().eval()
    grids = {"A": {"tokens": torch.randn(1, 3, 12, 7)}, "B": {"tokens": torch.randn(1, 3, 9, 4)}}
    exported = executorch_dynamic(model, grids["A"])
    assert "_patch_antialiased_resize_as_matmuls" in exported.applied
    assert_runs_like_eager(exported, model, grids["A"])
    assert_runs_like_eager(exported, model, grids["B"])
    with disabled_workarounds("_patch_antialiased_resize_as_matmuls"):
        with pytest.raises(exporters.ExecutorchExportError, match="not in Core ATen") as failure:
            executorch_dynamic(model, grids["A"])
    assert failure.value.stage == "to-edge"


def test_antialiased_bicubic_resize_weights_are_torchs():
    grids = [torch.randn(2, 3, rows, columns) for rows, columns in [(7, 7), (16, 12), (3, 5)]]
    sizes = [(4, 4), (7, 7), (16, 16), (5, 23), (1, 3), (31, 2)]
    fired = set()
    for grid in grids:
        for size in sizes:
            expected = torch.nn.functional.interpolate(grid, size=size, mode="bicubic", antialias=True)
            with apply_patches("executorch", fired, select=lambda path: path == "torch.nn.functional.interpolate"):
                resized = torch.nn.functional.interpolate(grid, size=size, mode="bicubic", antialias=True)
            torch.testing.assert_close(resized, expected, atol=1e-5, rtol=1e-5)
    assert fired == {"_patch_antialiased_resize_as_matmuls"}


def test_a_vocos_head_turns_its_spectrum_into_audio_in_real_products():
    """NeuCodec's inverse STFT on the ExecuTorch runtime, frames of 96 samples every 24 (its hop, the encoder's 16
    at the decoder's 1.5 times the rate; 36 samples trimmed on each side)."""
    from transformers import NeuCodecConfig
    from transformers.models.neucodec.modeling_neucodec import NeuCodecISTFTHead

    head = NeuCodecISTFTHead(NeuCodecConfig(hidden_size=32, downsampling_ratios=[2, 2, 4])).eval()
    inputs = {"hidden_states": torch.randn(2, 9, 32)}
    exporter, config = exporters.exporter_for("executorch")
    exported = exporter.export(head, inputs, config)
    assert "_patch_vocos_istft_as_real_products" in exported.applied
    (audio,) = exported(**inputs).values()
    torch.testing.assert_close(torch.as_tensor(audio), head(**inputs), atol=1e-4, rtol=1e-4)
    with disabled_workarounds("_patch_vocos_istft_as_real_products"), pytest.raises(Exception, match="aten.polar"):
        exporter.export(head, inputs, config)


def test_executorch_embeds_tubelets_of_a_video_whose_sizes_are_symbolic():
    model, traced = Tubelets().eval(), {"video": torch.randn(2, 3, 4, 8, 12)}
    exported = executorch_dynamic(model, traced)
    assert "_patch_conv3d_as_frames_of_conv2d" in exported.applied
    other = torch.randn(3, 3, 6, 12, 8)
    (got,) = exported(video=other).values()
    torch.testing.assert_close(got, model(other), atol=1e-5, rtol=1e-5)
    with disabled_workarounds("_patch_conv3d_as_frames_of_conv2d"):
        as_traced = executorch_dynamic(model, traced)
    with pytest.raises(RuntimeError, match="0x12"):  # 3-D and 4-D inputs only
        as_traced(**traced)


def test_executorch_draws_random_integers_from_rand():
    exporter, config = exporters.exporter_for("executorch")
    exported = exporter.export(KeySample().eval(), {"keys": torch.randn(2, 8)}, config)
    assert "_patch_randint_as_scaled_rand" in exported.applied
    sample, small = exported(keys=torch.randn(2, 8)).values()
    assert sample.dtype == small.dtype == torch.int64 and small.shape == (2, 5)
    assert set(sample.tolist()) == set(range(8))  # every key can be drawn (each misses 400 draws with p < 1e-23)
    assert set(small.tolist()[0] + small.tolist()[1]) <= {0, 1, 2}
    with disabled_workarounds("_patch_randint_as_scaled_rand"), pytest.raises(exporters.ExportError, match="randint"):
        exporter.export(KeySample().eval(), {"keys": torch.randn(2, 8)}, config)


def test_executorch_repeats_by_counts_of_a_symbolic_number_of_images():
    model = PatchIndexPerImage().eval()
    exporter, config = exporters.exporter_for("executorch", dynamic=True)
    exported = exporter.export(model, {"patches": torch.randn(5, 3), "patches_per_image": torch.tensor([2, 3])}, config)
    assert "_patch_repeat_interleave_as_gather" in exported.applied
    other = {"patches": torch.randn(6, 3), "patches_per_image": torch.tensor([1, 2, 3])}  # one image more
    (got,) = exported(**other).values()
    torch.testing.assert_close(got, model(**other))
