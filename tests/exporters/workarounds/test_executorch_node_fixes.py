"""The ExecuTorch workarounds of `exporters/executorch/node_fixes.py` (stage 5, FX node fixes): each passes with its
workaround and fails, or differs from eager, without it.
"""

import copy

import pytest
import torch

import exporters
from exporters.workarounds import disabled_workarounds
from harness.tables import DTYPE_TOLERANCE

from ..conftest import TOLERANCE, assert_parity
from .modules import (
    AttentionSinkMax,
    CheckedTokens,
    CircularTokenConvolution,
    CroppedUpscale,
    EmptyCacheExtended,
    EmptyCacheGrown,
    EmptyKeysConcatenated,
    EvalModeDropout,
    ExpandedKeys,
    KeypointPlaces,
    KeypointsAboveThreshold,
    LevelOrder,
    MaskedTail,
    NoiseRanks,
    PaddedToBlocks,
    RankedQueries,
    SameEosCount,
    SelectedCounts,
    SilencedNoise,
    Softmaxed,
    StridePool,
    TOKENS,
    TimeShift,
    TokenPReLU,
    Tubelets,
    UnbatchedNonMaximumSuppression,
    assert_runs_like_eager,
    built_by_the_sweep,
    check_pattern_case,
    check_runtime_case,
    executorch_dynamic,
    export_module,
    export_tiny,
)


RUNTIME_CASES = [  # (module, inputs, workaround, what the ExecuTorch runtime says without it)
    (Tubelets, {"video": torch.randn(2, 3, 4, 8, 12)}, "_fix_patchify_conv3d", "0x12"),  # 3-D and 4-D only
    (Tubelets, {"video": torch.randn(2, 3, 5, 9, 14)}, "_fix_patchify_conv3d", "0x12"),  # leftovers uncovered
    (NoiseRanks, {"noise": torch.randn(2, 9)}, "_fix_sort_as_topk", "no kernel for aten::sort"),
    (TimeShift, {"hidden_states": torch.randn(2, 5, 4)}, "_fix_negative_padding_as_slice", "0x12"),
]  # fmt: skip


@pytest.mark.parametrize("module, inputs, workaround, error", RUNTIME_CASES, ids=[c[2] for c in RUNTIME_CASES])
def test_a_pattern_the_executorch_runtime_cannot_run_is_rewritten(module, inputs, workaround, error):
    check_runtime_case(module, inputs, workaround, error)


MODULE_CASES = [  # (backend, module, inputs, workaround, error without it)
    ("executorch", CheckedTokens, {"input_ids": torch.tensor([[3, 1, 4], [1, 5, 9]])},
     "_fix_tensor_condition_assert", "_is_all_true.default is not in Core ATen"),
    ("executorch", SameEosCount, {"input_ids": torch.tensor([[3, 1, 4], [1, 5, 9]])},
     "_fix_size_only_check", "unique_consecutive.default is not in Core ATen"),
    ("executorch", AttentionSinkMax, {"scores": torch.randn(2, 4, 7, 8)},
     "_fix_max_for_xnnpack", "amax.default only supports dim == 2 or dim == 3"),
    ("executorch", StridePool, {"tokens": torch.randn(2, 16, 8)},
     "_fix_max_for_xnnpack", "amax.default only supports"),
    ("executorch", TokenPReLU, {"tokens": torch.randn(2, 5, 8)},
     "_fix_prelu_for_xnnpack", "ChannelsLastTaggedReshapePass"),
    ("executorch", UnbatchedNonMaximumSuppression, {"scores": torch.randn(2, 8, 8)},
     "_fix_unbatched_pool_for_xnnpack", "ChannelsLastTaggedReshapePass"),
    ("executorch", EvalModeDropout, {"embeddings": torch.randn(2, 3, 4)},
     "_fix_certain_bernoulli", "bernoulli.p is not in Core ATen"),
    ("executorch", MaskedTail, {"tokens": torch.randn(2, 6, 3), "masked": torch.tensor([False, True, True, False])},
     "_fix_tail_slice_of_a_count_from_the_front", r"data-dependent expression -u\d+ < 0"),
    ("executorch", SilencedNoise, {"means": torch.randn(2, 3, 5), "log_variances": torch.randn(2, 3, 5)},
     "_fix_noise_scaled_by_zero", r"randn(_like)?\.default is not in Core ATen"),
]  # fmt: skip


@pytest.mark.parametrize("backend, module, inputs, workaround, error", MODULE_CASES, ids=[c[3] for c in MODULE_CASES])
def test_a_traced_pattern_exports_with_its_workaround_and_fails_without(backend, module, inputs, workaround, error):
    check_pattern_case(backend, module, inputs, workaround, error)


def test_executorch_empty_of_dynamic_size_keeps_its_axes():
    model = ExpandedKeys().eval()
    exported = executorch_dynamic(model, TOKENS["A"])
    assert "_fix_empty_of_symbolic_size" in exported.applied
    assert all(isinstance(size, str) for size in exported.metadata["input_shapes"]["tokens"][:2]), "batch and length"
    assert_runs_like_eager(exported, model, TOKENS["B"])
    with disabled_workarounds("_fix_empty_of_symbolic_size"):
        pinned = executorch_dynamic(model, TOKENS["A"])
    assert pinned.metadata["input_shapes"]["tokens"][:2] == [2, 7], "int[] sizes pinned both axes"


def test_executorch_attention_output_gets_one_layout(tiny):
    model = tiny("GPT2LMHeadModel")  # views its attention output for the projection (Conv1D's x.view(-1, width))
    exported = export_tiny(model, "executorch")
    assert "_fix_attention_output_layout" in exported.applied
    assert_parity(exported(**model.inputs["A"]), model.expected["A"], TOLERANCE["executorch"])
    with disabled_workarounds("_fix_attention_output_layout"):
        with pytest.raises(exporters.ExecutorchExportError, match="Cannot view a tensor with shape") as failure:
            export_tiny(model, "executorch")
    assert failure.value.stage == "to-edge"


def test_masked_video_pre_training_runs_in_executorch():
    """Its decoder keeps the last `masked` tokens, a count read from the mask; attention then has strides summing
    the visible and the masked counts."""
    context = built_by_the_sweep("VideoMAEForPreTraining")
    exported = export_tiny(context, "executorch")
    assert {"_fix_tail_slice_of_a_count_from_the_front", "_patch_dim_order_of_contiguous_strides"} <= set(
        exported.applied)
    assert_parity(exported(**context.inputs["A"]), context.expected["A"], TOLERANCE["executorch"])


def test_an_fft_autocorrelation_runs_on_executorch_in_real_ops():
    """Autoformer's attention: the correlation of queries and keys at every lag, through rfft, conj and irfft."""
    from transformers.models.autoformer.modeling_autoformer import AutoformerAttention

    attention = AutoformerAttention(embed_dim=16, num_heads=2).eval()
    inputs = {"hidden_states": torch.randn(2, 12, 16)}
    exporter, config = exporters.exporter_for("executorch")
    exported = exporter.export(attention, inputs, config)
    assert "_fix_fft_cross_correlation_as_real_sum" in exported.applied
    output, correlations = (torch.as_tensor(value) for value in exported(**inputs).values())
    expected_output, expected_correlations = attention(**inputs)
    torch.testing.assert_close(correlations, expected_correlations, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(output, expected_output, atol=1e-4, rtol=1e-4)
    with disabled_workarounds("_fix_fft_cross_correlation_as_real_sum"), pytest.raises(Exception, match="_conj"):
        exporter.export(attention, inputs, config)


def test_executorch_attention_sinks_softmax_matches_eager():
    # XNNPACK lowered the 4-D max it took, and the softmax after it came out 0.9 off: the max is left to it no more
    model, scores = AttentionSinkMax().eval(), torch.randn(2, 4, 7, 8)
    exporter, config = exporters.exporter_for("executorch")
    exported = exporter.export(Softmaxed(model), {"scores": scores}, config)
    assert "_fix_max_for_xnnpack" in exported.applied
    torch.testing.assert_close(exported(scores=scores)["output"], torch.softmax(model(scores), -1), atol=1e-5, rtol=1e-5)


def test_executorch_sorts_a_symbolic_length_as_a_top_k_of_all():
    model = NoiseRanks().eval()
    exporter, config = exporters.exporter_for("executorch", dynamic=True)
    exported = exporter.export(model, {"noise": torch.randn(2, 9)}, config)
    assert "_fix_sort_as_topk" in exported.applied
    other = {"noise": torch.randn(3, 7)}  # another length
    (got,) = exported(**other).values()
    torch.testing.assert_close(got, model(**other))


@pytest.mark.parametrize("model, inputs", [
    (RankedQueries(), {"queries": torch.randn(2, 12, 5)}),  # descending, a 0/1 key
    (LevelOrder(), {"levels": torch.randint(0, 3, (2, 16), dtype=torch.int32)}),  # ascending, values too
])  # fmt: skip
def test_executorch_sorts_equal_integers_in_the_order_they_came(model, inputs):
    exported = export_module(model.eval(), inputs, "executorch")
    assert "_fix_sort_as_topk" in exported.applied
    for got, expected in zip(exported(**inputs).values(), model(**inputs), strict=True):
        torch.testing.assert_close(got, expected)


def test_executorch_crops_a_channels_last_image_at_a_symbolic_size():
    model, traced = CroppedUpscale().eval(), {"tokens": torch.randn(2, 6, 5, 4)}
    exported = executorch_dynamic(model, traced)
    assert "_fix_slice_of_channels_last_from_a_contiguous_copy" in exported.applied
    assert_runs_like_eager(exported, model, {"tokens": torch.randn(3, 7, 6, 4)})
    with disabled_workarounds("_fix_slice_of_channels_last_from_a_contiguous_copy"):
        as_traced = executorch_dynamic(model, traced)
    with pytest.raises(RuntimeError, match="0x12"):  # the slice's copy refuses two dim orders
        as_traced(**traced)


def test_executorch_pads_circularly_by_concatenation_and_keeps_the_batch_symbolic():
    model = CircularTokenConvolution().eval()
    exporter, config = exporters.exporter_for("executorch", dynamic=True)
    exported = exporter.export(model, {"series": torch.randn(2, 6, 3)}, config)
    assert "_fix_circular_padding_as_concatenation" in exported.applied
    other = {"series": torch.randn(3, 6, 3)}  # another batch
    (got,) = exported(**other).values()
    torch.testing.assert_close(got, model(**other), atol=1e-5, rtol=1e-5)
    with disabled_workarounds("_fix_circular_padding_as_concatenation"):
        as_decomposed = exporter.export(model, {"series": torch.randn(2, 6, 3)}, config)
    with pytest.raises(RuntimeError, match="set_inputs"):  # the batch was fixed at 2
        as_decomposed(**other)


def test_executorch_widens_an_int32_scatter_index():
    model, inputs = SelectedCounts().eval(), {"selected": torch.tensor([[0, 2, 2, 5], [1, 1, 3, 0]])}
    exporter, config = exporters.exporter_for("executorch")
    exported = exporter.export(model, inputs, config)
    assert "_fix_scatter_index_as_int64" in exported.applied
    (got,) = exported(**inputs).values()
    assert torch.equal(got, model(**inputs))
    with disabled_workarounds("_fix_scatter_index_as_int64"), pytest.raises(exporters.ExportError, match="mismatched"):
        exporter.export(model, inputs, config)


def test_executorch_returns_a_slice_that_keeps_everything_as_its_input():
    context = built_by_the_sweep("Swin2SRForImageSuperResolution")  # crops its image to the size it has
    exported = export_tiny(context, "executorch")
    assert "_fix_alias_as_its_input" in exported.applied
    assert_parity(exported(**context.inputs["A"]), context.expected["A"], TOLERANCE["executorch"])
    with disabled_workarounds("_fix_alias_as_its_input"):
        as_traced = export_tiny(context, "executorch")
    with pytest.raises(RuntimeError, match="0x12"):  # the copy's input and output dim orders differ
        as_traced(**context.inputs["A"])


@pytest.mark.parametrize("dynamic", [False, True])
def test_executorch_lays_out_the_nonzero_of_a_matrix_by_rows(dynamic):
    torch.manual_seed(0)
    model, scores, other = KeypointsAboveThreshold().eval(), torch.rand(6, 5), torch.rand(6, 5)
    exporter, config = exporters.exporter_for("executorch", dynamic=dynamic)
    exported = exporter.export(model, {"scores": scores}, config)
    assert {"_fix_nonzero_laid_out_by_rows", "_patch_contiguous_order_below_four_axes"} <= set(exported.applied)
    for inputs in (scores, other):  # 12 and 14 keypoints
        for got, want in zip(exported(scores=inputs).values(), model(inputs), strict=True):
            assert torch.equal(got, want)
    with disabled_workarounds("_fix_nonzero_laid_out_by_rows"), pytest.raises(Exception, match="Failed to map"):
        exporter.export(model, {"scores": scores}, config)  # the dim order (1, 0) of its transposed strides
    with disabled_workarounds("_patch_contiguous_order_below_four_axes"), pytest.raises(RuntimeError, match="0x12"):
        exporter.export(model, {"scores": scores}, config)(scores=other)  # the copy read the rows as columns


@pytest.mark.parametrize(
    "module, sizes, other_sizes",
    [
        (EmptyCacheExtended, {"states": (2, 5, 4)}, {"states": (3, 7, 4)}),  # a 1-D empty start, then the step's
        (EmptyKeysConcatenated, {"states": (2, 5, 4)}, {"states": (3, 7, 4)}),  # along the axis of no width
        (EmptyCacheGrown, {"past": (2, 1, 5, 0), "states": (2, 1, 4)}, {"past": (3, 1, 8, 0), "states": (3, 1, 4)}),
    ],
    ids=["first-step", "keys", "decode-step"],
)
def test_executorch_sizes_a_concatenation_of_empty_tensors_as_eager(module, sizes, other_sizes):
    torch.manual_seed(0)
    model = module().eval()
    inputs, other = ({name: torch.randn(size) for name, size in given.items()} for given in (sizes, other_sizes))
    exporter, config = exporters.exporter_for("executorch", dynamic=True)
    exported = exporter.export(model, inputs, config)
    assert "_fix_empty_cat_as_zeros_of_its_size" in exported.applied
    for got, want in zip(exported(**other).values(), model(**other), strict=True):
        assert got.shape == want.shape and torch.equal(got, want)
    with disabled_workarounds("_fix_empty_cat_as_zeros_of_its_size"):
        try:
            shapes = [tuple(got.shape) for got in exporter.export(model, inputs, config)(**other).values()]
        except exporters.ExportError as error:  # the lowering's `full` of a symbolic size
            assert "int list" in str(error)
        else:
            assert shapes != [tuple(want.shape) for want in model(**other)]  # the runtime's cat lost the length


@pytest.mark.parametrize("dynamic", [False, True])
def test_executorch_integer_remainder_takes_the_sign_of_the_divisor(dynamic):
    model, matched = KeypointPlaces().eval(), torch.tensor([[-1, 3, 5, -6, 0, -8]])
    longer = torch.tensor([[-1, 3, 5, -6, 0, -8, 7, -3]])
    exporter, config = exporters.exporter_for("executorch", dynamic=dynamic)
    exported = exporter.export(model, {"matched": matched}, config)
    assert "_fix_integer_remainder_sign" in exported.applied
    for inputs in (matched, longer) if dynamic else (matched,):
        (got,) = exported(matched=inputs).values()
        assert torch.equal(got, model(inputs))
    with disabled_workarounds("_fix_integer_remainder_sign"):
        (got,) = exporter.export(model, {"matched": matched}, config)(matched=matched).values()
        assert got[0].tolist() == [[-1, 3, 1, -2, 0, 0]]  # the dividend's sign, as C's `%`


def test_executorch_remainder_of_sizes_takes_the_sign_of_the_divisor():
    model = PaddedToBlocks().eval()
    exported = executorch_dynamic(model, {"tokens": torch.randn(2, 7, 3)})
    assert "_fix_integer_remainder_sign" in exported.applied
    for length in (7, 5, 8):
        assert_runs_like_eager(exported, model, {"tokens": torch.randn(3, length, 3)})
    with disabled_workarounds("_fix_integer_remainder_sign"):
        as_lowered = executorch_dynamic(model, {"tokens": torch.randn(2, 7, 3)})
    with pytest.raises(RuntimeError, match="0x12"):  # padded by -3, a block short: the view refuses its size
        as_lowered(tokens=torch.randn(2, 7, 3))


@pytest.fixture(scope="module")
def swin_v2_last_norm():
    """Swin V2's last norm: 256 channels, where ExecuTorch's optimized layer norm takes its SIMD path."""
    norm = built_by_the_sweep("Swinv2Model").model.layernorm
    assert norm.normalized_shape == (256,)
    return norm


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_executorch_half_layer_norm_over_256_channels_matches_eager(swin_v2_last_norm, dtype):
    norm = copy.deepcopy(swin_v2_last_norm).to(getattr(torch, dtype))
    hidden = torch.randn(2, 4, 256, generator=torch.Generator().manual_seed(0)).to(norm.weight.dtype)
    want = norm(hidden)
    exported = export_module(norm, {"input": hidden}, "executorch")
    assert "_fix_half_layer_norm_in_float32" in exported.applied
    (got,) = exported(input=hidden).values()
    atol = DTYPE_TOLERANCE[dtype][0]
    torch.testing.assert_close(got, want, atol=atol, rtol=atol)
    with disabled_workarounds("_fix_half_layer_norm_in_float32"):
        (as_lowered,) = export_module(norm, {"input": hidden}, "executorch")(input=hidden).values()
    assert (as_lowered.float() - want.float()).abs().max() > 1  # the SIMD path's error, units not ulps


def test_executorch_float32_layer_norm_is_left_alone(swin_v2_last_norm):
    hidden = torch.randn(2, 4, 256, generator=torch.Generator().manual_seed(0))
    exported = export_module(swin_v2_last_norm, {"input": hidden}, "executorch")
    assert "_fix_half_layer_norm_in_float32" not in exported.applied
    (got,) = exported(input=hidden).values()
    assert_parity({"out": got}, {"out": swin_v2_last_norm(hidden)}, TOLERANCE["executorch"])
