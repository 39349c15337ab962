"""Each workaround on the smallest model that needs it: the export matches eager with it and fails without it."""

import contextlib
import math
import types

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

import exporters
from exporters.utils import apply_patches, disabled_workarounds, split_inputs

from .conftest import TOLERANCE, assert_parity


def _export_module(model, inputs, backend, dynamic=False):
    exporter, config = exporters.exporter_for(backend, dynamic=dynamic)
    return exporter.export(model, inputs, config)


def _export(tiny_model, backend, dynamic=False):
    return _export_module(tiny_model.model, tiny_model.inputs["A"], backend, dynamic)


def test_nllb_moe_exports_through_dynamo_with_its_patches(tiny):
    from transformers.models.nllb_moe import modeling_nllb_moe

    router = modeling_nllb_moe.NllbMoeTop2Router
    original_to, original_forward = torch.nn.Module.to, router.forward
    seen_during_export = []
    model = tiny("NllbMoeForConditionalGeneration")

    def spying_forward(self, *args, **kwargs):
        seen_during_export.append(torch.nn.Module.to is not original_to)
        return original_forward(self, *args, **kwargs)

    router.forward = spying_forward
    try:
        exported = _export(model, "dynamo", dynamic=True)
    finally:
        router.forward = original_forward
    assert seen_during_export and all(seen_during_export), "the cast patch is active while the model is traced"
    assert torch.nn.Module.to is original_to, "and gone after"
    assert {"_patch_module_cast_to_its_own_dtype", "_patch_nllb_moe_experts_dense"} <= set(exported.applied)
    assert_parity(exported(**model.inputs["A"]), model.expected["A"], TOLERANCE["dynamo"])
    assert_parity(exported(**model.inputs["B"]), model.expected["B"], TOLERANCE["dynamo"])


@pytest.mark.parametrize(
    "workaround, error",
    [("_patch_module_cast_to_its_own_dtype", "Couldn't swap"), ("_patch_nllb_moe_experts_dense", "data-dependent")],
)
def test_nllb_moe_fails_without_each_patch(tiny, workaround, error):
    with disabled_workarounds(workaround), pytest.raises(exporters.DynamoExportError, match=error) as failure:
        _export(tiny("NllbMoeForConditionalGeneration"), "dynamo")
    assert failure.value.stage == "torch-export"


def test_t5_onnx_needs_the_reshape_fix(tiny):
    model = tiny("T5ForConditionalGeneration")
    exported = _export(model, "onnx")
    assert "_fix_reshape_of_strided_view" in exported.applied
    with disabled_workarounds("_fix_reshape_of_strided_view"):
        with pytest.raises(exporters.OnnxExportError, match="Cannot view a tensor") as failure:
            _export(model, "onnx")
    assert failure.value.stage == "decompositions"


class _Projection(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.projection = torch.nn.Linear(4, 4)

    def forward(self, tokens):
        return self.projection(tokens)


class _ExpertCapacity(torch.nn.Module):
    """NLLB-MoE's router: each expert takes the tokens ranked below a capacity, a fraction of the token count."""

    def forward(self, tokens):
        capacity = math.ceil(0.75 * tokens.shape[0] * tokens.shape[1])
        ranks = torch.arange(tokens.shape[0] * tokens.shape[1]).reshape(tokens.shape[:2])
        return tokens * torch.lt(ranks, capacity)[..., None]


class _FusedProjection(torch.nn.Module):
    """CodeGen's attention: one projection split into queries, keys and values (an op returning Tensor[])."""

    def __init__(self):
        super().__init__()
        self.projection = torch.nn.Linear(4, 12)

    def forward(self, tokens):
        query, key, value = self.projection(tokens).split(4, dim=-1)
        return query * key + value


class _ExpandedKeys(torch.nn.Module):
    """DeepSeek-V2's MLA attention: keys assembled into a `new_empty` of (batch, length, width)."""

    def forward(self, tokens):
        keys = tokens.new_empty((tokens.shape[0], tokens.shape[1], 8))
        keys[..., :4] = tokens
        keys[..., 4:] = tokens * 2
        return keys


def _executorch_dynamic(model, inputs):
    return _export_module(model, inputs, "executorch", dynamic=True)


TOKENS = {"A": {"tokens": torch.randn(2, 7, 4)}, "B": {"tokens": torch.randn(3, 5, 4)}}


def _assert_runs_like_eager(exported, model, inputs):
    torch.testing.assert_close(exported(**inputs)["output"], model(**inputs), atol=1e-5, rtol=1e-5)


def test_executorch_dynamic_axes_get_an_upper_bound():
    model, longer = _Projection().eval(), {"tokens": torch.randn(3, 20, 4)}  # four times the traced elements
    exported = _executorch_dynamic(model, TOKENS["A"])
    assert "_fix_unbounded_dynamic_axes" in exported.applied
    _assert_runs_like_eager(exported, model, longer)
    with disabled_workarounds("_fix_unbounded_dynamic_axes"):
        unbounded = _executorch_dynamic(model, TOKENS["A"])
    with pytest.raises(RuntimeError, match="set_inputs"):
        unbounded(**longer)  # memory was planned for the traced size only


class _FramedSamples(torch.nn.Module):
    """X-Codec 2 reads raw samples beside their features, a fixed number of samples per frame (320; 20 here): the
    samples' axis is an expression of the frames' symbol, at least 40 for the two frames an axis has at least."""

    def forward(self, samples, features):
        return samples.view(samples.shape[0], features.shape[1], 20) + features


def test_an_axis_sized_by_an_expression_gets_its_bound_from_its_traced_size():
    model = _FramedSamples()
    inputs = {"samples": torch.randn(2, 100), "features": torch.randn(2, 5, 20)}
    exported = _executorch_dynamic(model, inputs)
    longer = {"samples": torch.randn(3, 180), "features": torch.randn(3, 9, 20)}
    _assert_runs_like_eager(exported, model, longer)


class _RepeatedByCounts(torch.nn.Module):
    """SeamlessM4T's vocoder: each unit repeated for its predicted duration, a length read from data."""

    def forward(self, tokens, counts):
        return tokens.repeat_interleave(counts, dim=0) * 2


def test_executorch_data_dependent_sizes_get_an_upper_bound():
    from exporters.exporter_executorch import _DATA_DEPENDENT_CEILING as ceiling

    model, tokens = _RepeatedByCounts().eval(), torch.randn(3, 4)
    traced = {"tokens": tokens, "counts": torch.tensor([1, 2, 3])}
    exported = _export_module(model, traced, "executorch")
    assert "_patch_sizes_bounded_exactly" in exported.applied
    for counts in ([5, 0, 9], [ceiling // 4, ceiling // 4, ceiling // 2]):  # past the traced total, up to the bound
        _assert_runs_like_eager(exported, model, {"tokens": tokens, "counts": torch.tensor(counts)})
    with pytest.raises(RuntimeError, match="execute"):  # past the bound the runtime refuses to resize
        exported(tokens=tokens, counts=torch.tensor([ceiling // 2, ceiling // 2, 1]))
    with disabled_workarounds("_patch_sizes_bounded_exactly"):
        with pytest.raises(exporters.ExecutorchExportError, match="finite upper bound") as failure:
            _export_module(model, traced, "executorch")
    assert failure.value.stage == "to-executorch"


class _AntialiasedResize(torch.nn.Module):
    """UnlimitedOCR's tower: its position grid resized (bicubic, antialiased) to the patch grid, here shrunk on one
    axis and grown on the other."""

    def forward(self, tokens):
        size = (tokens.shape[2] // 2, tokens.shape[3] * 2 + 1)
        return torch.nn.functional.interpolate(tokens, size=size, mode="bicubic", antialias=True, align_corners=False)


def test_executorch_antialiased_bicubic_resize_as_matrix_products():
    model = _AntialiasedResize().eval()
    grids = {"A": {"tokens": torch.randn(1, 3, 12, 7)}, "B": {"tokens": torch.randn(1, 3, 9, 4)}}
    exported = _executorch_dynamic(model, grids["A"])
    assert "_patch_antialiased_resize_as_matmuls" in exported.applied
    _assert_runs_like_eager(exported, model, grids["A"])
    _assert_runs_like_eager(exported, model, grids["B"])
    with disabled_workarounds("_patch_antialiased_resize_as_matmuls"):
        with pytest.raises(exporters.ExecutorchExportError, match="not in Core ATen") as failure:
            _executorch_dynamic(model, grids["A"])
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


def test_executorch_python_symbolic_ops_reach_the_edge_dialect():
    model = _ExpertCapacity().eval()
    exported = _executorch_dynamic(model, TOKENS["A"])
    assert "_patch_edge_verifier_python_symbolic_ops" in exported.applied
    _assert_runs_like_eager(exported, model, TOKENS["B"])
    with disabled_workarounds("_patch_edge_verifier_python_symbolic_ops"):
        with pytest.raises(exporters.ExecutorchExportError) as failure:
            _executorch_dynamic(model, TOKENS["A"])
    assert failure.value.stage == "to-edge"


def test_bare_tensor_output_is_named_output():
    class Double(torch.nn.Module):
        def forward(self, x):
            return x * 2

    exported = exporters.OnnxExporter().export(Double(), {"x": torch.ones(2)})
    assert exported.output_names == ["output"]
    assert exporters.named_leaves(Double()(torch.ones(2))).keys() == {"output"}


def test_an_input_that_is_a_view_is_traced_without_its_base():
    class HalvedGrid(torch.nn.Module):
        def forward(self, grid):
            return (grid // 2).prod(-1).sum() + grid.unbind(-1)[0]

    grid = torch.tensor([[1, 1, 4, 4], [1, 1, 6, 4]])[:, 2:]  # a view, as an input factory may slice its sizes
    axes = {"grid": {0: torch.export.Dim.AUTO}}
    exporter, config = exporters.exporter_for("dynamo", dynamic=True, dynamic_shapes=axes)
    exported = exporter.export(HalvedGrid(), {"grid": grid}, config)
    other = torch.tensor([[2, 2], [4, 4], [6, 6]])
    torch.testing.assert_close(exported(grid=other)["output"], HalvedGrid()(other))


def test_python_numbers_among_the_outputs_stay_out_of_the_onnx_graph():
    class StepPredictor(torch.nn.Module):  # Qwen3-Omni's code predictor returns the step it is at
        def forward(self, embeddings):
            return {"logits": embeddings * 2, "generation_steps": embeddings.shape[1] - 2}

    inputs = {"embeddings": torch.randn(2, 5)}
    exported = _export_module(StepPredictor(), inputs, "onnx")
    assert "_patch_constant_outputs_left_out" in exported.applied
    assert exported(**inputs).keys() == exporters.named_leaves(StepPredictor()(**inputs)).keys() == {"logits"}
    assert torch.equal(exported(**inputs)["logits"], inputs["embeddings"] * 2)
    with disabled_workarounds("_patch_constant_outputs_left_out"), pytest.raises(exporters.ExportError, match="name"):
        _export_module(StepPredictor(), inputs, "onnx")


class _ClippedProjections(torch.nn.Module):
    """Gemma 4's audio attention: query, key and value each clamp the one input between bounds kept as buffers."""

    def __init__(self):
        super().__init__()
        self.projections = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))
        self.register_buffer("bounds", torch.tensor([[-1.0, 1.0], [-2.0, 0.5], [-0.5, 2.0]]))

    def forward(self, hidden_states):
        return tuple(projection(torch.clamp(hidden_states, low, high))
                     for projection, (low, high) in zip(self.projections, self.bounds))


def test_the_onnx_optimizer_names_the_bounds_it_fuses_apart():
    model, inputs = _ClippedProjections().eval(), {"hidden_states": 3 * torch.randn(2, 4)}
    exported = _export_module(model, inputs, "onnx")
    assert "_patch_fused_bounds_named_by_their_node" in exported.applied
    for got, want in zip(exported(**inputs).values(), model(**inputs), strict=True):
        torch.testing.assert_close(got, want)
    with disabled_workarounds("_patch_fused_bounds_named_by_their_node"):
        unpatched = _export_module(model, inputs, "onnx")
        with pytest.raises(Exception, match="is not a graph input"):
            unpatched(**inputs)


class _FeatureMapSizes(torch.nn.Module):
    """SAM 3: the encoder records its feature map's size in a tensor; the decoder reads it back to build a position
    bias over the map, which attention then checks against the keys."""

    def forward(self, features, queries):
        sizes = torch.tensor([tuple(features.shape[-2:])])
        height, width = sizes[0, 0], sizes[0, 1]
        bias = (torch.arange(height)[:, None] + torch.arange(width)).flatten().float()
        keys = features.flatten(2).transpose(1, 2)[:, None]
        return torch.nn.functional.scaled_dot_product_attention(queries, keys, keys, attn_mask=bias[None, None, None])


def test_a_static_export_keeps_the_values_of_small_tensors_the_forward_builds(monkeypatch):
    model, inputs = _FeatureMapSizes(), {"features": torch.randn(2, 8, 4, 5), "queries": torch.randn(2, 1, 3, 8)}
    exported = _export_module(model, inputs, "dynamo")
    assert torch.equal(exported(**inputs)["output"], model(**inputs))
    monkeypatch.setattr("exporters.exporter_dynamo._SIZE_NUMEL_LIMIT", 1)  # torch's own: values of one element
    with pytest.raises(exporters.ExportError, match="data-dependent"):
        _export_module(model, inputs, "dynamo")


def test_mixture_of_experts_runs_batched_matmuls_for_export(tiny):
    model = tiny("Qwen2MoeForCausalLM")
    exported = _export(model, "onnx")
    assert "_patch_experts_batched_mm" in exported.applied
    assert_parity(exported(**model.inputs["A"]), model.expected["A"], TOLERANCE["onnx"])
    with disabled_workarounds("_patch_experts_batched_mm"):
        with pytest.raises(exporters.OnnxExportError, match="grouped_mm_fallback"):
            _export(model, "onnx")


def test_dense_models_do_not_report_the_experts_patch(tiny):
    assert "_patch_experts_batched_mm" not in _export(tiny("LlamaForCausalLM"), "dynamo").applied


def test_xnnpack_leaves_1d_convolutions_with_two_dynamic_axes_to_portable_kernels():
    # Wav2Vec2's feature encoder: strided convolutions over (batch, channels, samples), batch and samples dynamic
    model = torch.nn.Sequential(torch.nn.Conv1d(1, 4, 10, stride=5), torch.nn.GELU(), torch.nn.Conv1d(4, 4, 3, 2))
    model.eval()
    audio, other = {"input": torch.randn(2, 1, 400)}, {"input": torch.randn(3, 1, 240)}
    exported = _executorch_dynamic(model, audio)
    assert "_patch_xnnpack_reshape_dynamic_axes" in exported.applied
    _assert_runs_like_eager(exported, model, other)
    assert "_patch_xnnpack_reshape_dynamic_axes" not in _export_module(model, audio, "executorch").applied, "static"
    with disabled_workarounds("_patch_xnnpack_reshape_dynamic_axes"):
        with pytest.raises(exporters.ExecutorchExportError, match="XNNPACK reshape only supports 1 dynamic"):
            _executorch_dynamic(model, audio)


def test_xnnpack_leaves_1d_batch_norm_with_two_dynamic_axes_to_portable_kernels():
    # Parakeet's convolution module: the convolution stays portable, the batch norm after it is fused or unsqueezed
    model = torch.nn.Sequential(torch.nn.Conv1d(4, 4, 3, groups=4), torch.nn.BatchNorm1d(4), torch.nn.SiLU()).eval()
    model[1].running_mean.normal_()
    exporter, config = exporters.exporter_for("executorch", dynamic=True)
    exported = exporter.export(model, {"input": torch.randn(2, 4, 9)}, config)
    assert "_patch_xnnpack_reshape_dynamic_axes" in exported.applied
    other = torch.randn(3, 4, 6)
    torch.testing.assert_close(exported(input=other)["output"], model(other), atol=1e-5, rtol=1e-5)
    with disabled_workarounds("_patch_xnnpack_reshape_dynamic_axes"):
        with pytest.raises(exporters.ExecutorchExportError, match="XNNPACK reshape only supports 1 dynamic"):
            exporter.export(model, {"input": torch.randn(2, 4, 9)}, config)


def test_executorch_edge_validator_leaves_a_dynamic_batch_dynamic():
    model = _FusedProjection().eval()
    exported = _executorch_dynamic(model, TOKENS["A"])
    assert "_patch_edge_validator_list_return" in exported.applied
    assert isinstance(exported.metadata["input_shapes"]["tokens"][0], str), "batch stays a symbol"
    _assert_runs_like_eager(exported, model, TOKENS["B"])
    with disabled_workarounds("_patch_edge_validator_list_return"):
        pinned = _executorch_dynamic(model, TOKENS["A"])
    assert pinned.metadata["input_shapes"]["tokens"][0] == 2, "the validator's len() pinned the batch"


@pytest.mark.parametrize(
    "backend, error, stage",
    [("onnx", "erf_inv", "onnx-translation"), ("executorch", "erfinv.default is not in Core ATen", "to-edge")],
)
def test_gemma3n_sparsity_quantile_is_a_constant_for_export(tiny, backend, error, stage):
    model = tiny("Gemma3nForCausalLM")  # its first layer keeps the top 5% of the MLP gate
    exported = _export(model, backend)
    assert "_patch_gemma3n_constant_icdf" in exported.applied
    assert_parity(exported(**model.inputs["A"]), model.expected["A"], TOLERANCE[backend])
    with disabled_workarounds("_patch_gemma3n_constant_icdf"):
        with pytest.raises(exporters.ExportError, match=error) as failure:
            _export(model, backend)
    assert failure.value.stage == stage
    assert error in failure.value.message.split("\n\n")[0], "the cause leads the message, before any advice"


@pytest.mark.parametrize(
    "backend, error, stage",
    [("onnx", "complex-valued input", "onnx-translation"), ("executorch", "view_as_complex", "to-edge")],
)
def test_complex_rotary_is_rotated_in_real_arithmetic(tiny, backend, error, stage):
    model = tiny("DeepseekV2ForCausalLM")  # its rotary table is complex (torch.polar)
    exported = _export(model, backend)
    assert {"_patch_complex_rotary_as_pairs", "_patch_rotate_pairs"} <= set(exported.applied)
    assert_parity(exported(**model.inputs["A"]), model.expected["A"], TOLERANCE[backend])
    workarounds = ("_patch_complex_rotary_as_pairs", "_patch_rotate_pairs")
    with disabled_workarounds(*workarounds), pytest.raises(exporters.ExportError, match=error) as failure:
        _export(model, backend)
    assert failure.value.stage == stage


class _PatchPositions(torch.nn.Module):
    """Idefics3's vision embeddings: fractional patch coordinates to position buckets."""

    def __init__(self):
        super().__init__()
        self.register_buffer("boundaries", torch.arange(1 / 4, 1.0, 1 / 4))

    def forward(self, coordinates):
        return torch.bucketize(coordinates, self.boundaries, right=True), torch.bucketize(coordinates, self.boundaries)




def test_executorch_empty_of_dynamic_size_keeps_its_axes():
    model = _ExpandedKeys().eval()
    exported = _executorch_dynamic(model, TOKENS["A"])
    assert "_fix_empty_of_symbolic_size" in exported.applied
    assert all(isinstance(size, str) for size in exported.metadata["input_shapes"]["tokens"][:2]), "batch and length"
    _assert_runs_like_eager(exported, model, TOKENS["B"])
    with disabled_workarounds("_fix_empty_of_symbolic_size"):
        pinned = _executorch_dynamic(model, TOKENS["A"])
    assert pinned.metadata["input_shapes"]["tokens"][:2] == [2, 7], "int[] sizes pinned both axes"


def test_executorch_attention_output_gets_one_layout(tiny):
    model = tiny("GPT2LMHeadModel")  # views its attention output for the projection (Conv1D's x.view(-1, width))
    exported = _export(model, "executorch")
    assert "_fix_attention_output_layout" in exported.applied
    assert_parity(exported(**model.inputs["A"]), model.expected["A"], TOLERANCE["executorch"])
    with disabled_workarounds("_fix_attention_output_layout"):
        with pytest.raises(exporters.ExecutorchExportError, match="Cannot view a tensor with shape") as failure:
            _export(model, "executorch")
    assert failure.value.stage == "to-edge"


@pytest.mark.parametrize("backend", ["dynamo", "onnx"])
def test_packed_images_attend_through_one_masked_sdpa(tiny, backend, monkeypatch):
    model = tiny("Qwen2VisionTransformerPretrainedModel")
    exported = _export(model, backend, dynamic=True)  # the image grid traced, not baked in
    assert "segmented_attention" in exported.applied
    assert_parity(exported(**model.inputs["A"]), model.expected["A"], TOLERANCE[backend])
    assert model.model.config._attn_implementation != exporters.exporter_dynamo.SEGMENTED_ATTENTION, "restored"
    # without it the tower splits its sequence by sizes read from the traced grid's values (a static export bakes
    # the grid in, and its sizes are numbers)
    monkeypatch.setattr(exporters.exporter_dynamo, "segmented_attention", lambda model, fired: contextlib.nullcontext())
    with pytest.raises(exporters.ExportError, match="data-dependent") as failure:
        _export(model, backend, dynamic=True)
    assert failure.value.stage == "torch-export"


def _built_by_the_sweep(name):
    """A class' tiny model, inputs and eager outputs as the sweep builds them."""
    from harness.cells import ClassContext
    from harness.models import select

    return ClassContext(select(name)[0]).prepare()


# and a retriever wrapping one (its positions need token types it does not take; its text layers meet the segmented
# attention without boundaries)
@pytest.mark.parametrize("name", ["Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration",
                                  "ColQwen2ForRetrieval"])
def test_a_qwen_vl_model_exports_with_its_rotary_positions_fed(name):
    context = _built_by_the_sweep(name)
    assert "position_ids" in context.inputs["A"]  # computed by the inputs, as a runner would (and 2.5's windows)
    exported = _export(context, "dynamo")
    assert "segmented_attention" in exported.applied
    assert_parity(exported(**context.inputs["A"]), context.expected["A"], TOLERANCE["dynamo"])


def test_packed_attention_under_a_data_dependent_length_exports():
    """MiniCPM-V's merger packs a length read from the image sizes: the segmented attention must not guard on it."""
    context = _built_by_the_sweep("MiniCPMV4_6ForConditionalGeneration")
    exported = _export(context, "dynamo")
    assert "segmented_attention" in exported.applied
    assert_parity(exported(**context.inputs["A"]), context.expected["A"], TOLERANCE["dynamo"])


@pytest.mark.parametrize("name, size_input, backend", [
    # its audio frames chunked by the number the mask marks real (exportable unbaked too, on a grid of chunks)
    ("Qwen2_5OmniThinkerForConditionalGeneration", "feature_attention_mask", "dynamo"),
    # its per-image merge factors: traced, a reshape by them left ExecuTorch a view of unplannable size
    ("VideoLlama3VisionModel", "merge_sizes", "dynamo"),
])  # fmt: skip
def test_a_static_export_bakes_in_the_image_and_audio_geometry(name, size_input, backend):
    context = _built_by_the_sweep(name)
    exported = _export(context, backend)
    assert size_input not in exported.input_names and "size_inputs_as_constants" in exported.applied
    assert_parity(exported(**context.inputs["A"]), context.expected["A"], TOLERANCE[backend])
    with pytest.raises(ValueError, match=f"{size_input}=.* differs from the value baked"):
        exported(**{**context.inputs["A"], size_input: context.inputs["A"][size_input] * 2})
    assert size_input in split_inputs(context.inputs["A"])[0]  # a dynamic export traces it


def test_a_cache_whose_lengths_differ_from_the_export_is_refused():
    """Diffusion Gemma's decoder reads a prompt cache: its sliding layer counts the prompt's tokens in a Python int,
    which the trace bakes in. A prompt of another length was computed with the wrong positions, silently."""
    context = _built_by_the_sweep("DiffusionGemmaDecoderModel")
    exported = _export(context, "dynamo", dynamic=True)
    assert_parity(exported(**context.inputs["A"]), context.expected["A"], TOLERANCE["dynamo"])
    with pytest.raises(ValueError, match=r"past_key_values .*\(layers\.0\.cumulative_length: 5, exported with 7\)"):
        exported(**context.inputs["B"])


CLASS_CASES = [  # (model class, tiny as the sweep builds it, backend, workaround, error without it)
    ("Gemma3ForSequenceClassification", "onnx", "_patch_mask_by_broadcast", "vmapped"),  # bidirectional images
    ("LongcatFlashModel", "dynamo", "_patch_longcat_flash_experts_dense", "data-dependent"),
    ("DbrxForCausalLM", "dynamo", "_patch_dbrx_experts_dense", "data-dependent"),
    ("Step3p7TextModel", "dynamo", "_patch_step3p7_experts_dense", "data-dependent"),
    ("SwitchTransformersForConditionalGeneration", "dynamo", "_patch_switch_transformers_experts_dense", "data-dep"),
    ("SwitchTransformersForConditionalGeneration", "dynamo", "_patch_module_cast_to_its_own_dtype", "Couldn't swap"),
    ("Wav2Vec2ForXVector", "executorch", "_patch_xvector_masked_statistics", "data-dependent"),  # slice to length
    ("Llama4VisionModel", "executorch", "_patch_llama4_vision_rotary_as_pairs", "complex"),
    ("FNetForMaskedLM", "executorch", "_patch_fnet_fourier_as_matmul", "_fft_c2c.default is not in Core ATen"),
    # BLT's patch starts cut at the largest count of entropy peaks (a number read from data), then viewed
    ("BltForCausalLM", "executorch", "_fix_counts_read_from_data_bounded", "data-dependent expression u"),
    ("BltForCausalLM", "executorch", "_patch_views_as_dynamic_as_their_base", "_ViewSpec is incompatible"),
    ("UdopForConditionalGeneration", "onnx", "_patch_udop_patches_as_fixed_rows", "data is not allocated"),
    ("LongformerForMaskedLM", "dynamo", "_patch_longformer_attention_dense", "data-dependent"),  # global tokens
    ("HunYuanVLForConditionalGeneration", "dynamo", "_patch_hunyuan_vl_placeholder_check_as_tensor", "data-dep"),
    ("Ovis2Model", "dynamo", "_patch_ovis2_visual_indicators_by_where", "data-dependent"),
    ("OpenAIPrivacyFilterModel", "dynamo", "_patch_experts_batched_mm", "data-dependent"),  # asks for the eager loop
    ("EncodecModel", "dynamo", "_patch_codec_conv_paddings_as_ints", "data-dependent"),  # paddings from 0-d buffers
    ("FastSpeech2ConformerModel", "dynamo", "_patch_length_regulator_gathered", "data-dependent"),  # loop, branch
    # its decoder's frame count is read from the durations, and its position table grows past it
    ("FastSpeech2ConformerModel", "dynamo", "_patch_relative_positions_within_table", "data-dependent"),
    # its distilling convolutions halve the sequence under a mask built for the whole of it
    ("InformerModel", "dynamo", "_patch_no_padding_means_no_mask", "Attention mask should be of size"),
    # a padding bucket picked by .item(); its bucket cache, hashed by seeded rotations, is an output
    ("ReformerModelWithLMHead", "dynamo", "_patch_reformer_padding_bucket_as_tensors", "data-dependent"),
    # prompt features cached by their token ids, read as numbers
    ("OmDetTurboForObjectDetection", "dynamo", "_patch_omdet_prompts_encoded_at_once", "data-dependent"),
    # patches gathered in a random order, the padding drawn at random, positions resized to each image's extent
    ("ViltForQuestionAnswering", "dynamo", "_patch_vilt_patches_in_place", "data-dependent"),
    # its sparse-attention indexer lists each query's keys with nonzero
    ("Qwen4ExpTextModel", "dynamo", "_patch_qwen4_indexer_by_masks", "data-dependent"),
    # a greedy decode that breaks once every row has ended
    ("SLANetSLAHead", "dynamo", "_patch_table_decode_cut_after", "data-dependent"),
    # its audio tower's attention windows, cut in a loop over lengths read from the mask
    ("Qwen3ASRModel", "dynamo", "_patch_audio_windows_padded", "data-dependent"),
    # its conformer's streaming mask finds each frame's chunk with nonzero
    ("Phi4MultimodalAudioModel", "dynamo", "_patch_streaming_mask_by_argmax", "data-dependent"),
    # its experts' config names no implementation: the eager loop
    ("DiffusionGemmaDecoderModel", "dynamo", "_patch_experts_batched_mm", "data-dependent"),
    # its units repeated by predicted durations, then padded to the longest: lengths read from data
    ("SeamlessM4TCodeHifiGan", "onnx", "_patch_pad_sequence_to_symbolic_longest", "data-dependent"),
    # its placeholder count checked against its image tokens in a Python `if`
    ("GlmImageModel", "dynamo", "_patch_glm_image_placeholder_check_as_tensor", "data-dependent"),
]


@pytest.mark.parametrize("name, backend, workaround, error", CLASS_CASES, ids=[case[2] for case in CLASS_CASES])
def test_a_model_class_exports_with_its_workaround_and_fails_without(name, backend, workaround, error):
    context = _built_by_the_sweep(name)
    assert context.ok, context.stages[-1].message
    exported = _export(context, backend)
    assert workaround in exported.applied
    assert_parity(exported(**context.inputs["A"]), context.expected["A"], TOLERANCE[backend])
    with disabled_workarounds(workaround), pytest.raises(exporters.ExportError, match=error):
        _export(context, backend)


def _exported_on_the_varying_axes(name, workarounds):
    """``name`` as the sweep builds it and its dynamic export on the axes the two input sets vary, with
    ``workarounds`` applied and the second set run like eager, that program, and ``export()``, which exports it again."""
    from harness.cells import varying_axes

    context = _built_by_the_sweep(name)
    first, second = context.inputs["A"], context.inputs["B"]
    exporter, config = exporters.exporter_for("dynamo", dynamic=True, dynamic_shapes=varying_axes(first, second))
    exported = exporter.export(context.model, first, config)
    assert set(workarounds) <= set(exported.applied)
    assert_parity(exported(**second), context.expected["B"], TOLERANCE["dynamo"])
    return context, exported, lambda: exporter.export(context.model, first, config)


def _fixed_axes_with_and_without(name, workarounds):
    """With each workaround disabled the export fixes some of the axes the sweep varies: which, per workaround."""
    from harness.cells import specialized_axes

    context, _, export = _exported_on_the_varying_axes(name, workarounds)
    first, second = context.inputs["A"], context.inputs["B"]
    fixed = {}
    for workaround in workarounds:
        with disabled_workarounds(workaround):
            program = export()
        fixed[workaround] = specialized_axes(program.metadata["input_shapes"], first, second)
    return fixed


class _RankedQueries(torch.nn.Module):
    """PP-DocLayout V2: queries sorted by whether they pass their class threshold, their boxes taken along."""

    def forward(self, queries):  # (batch, queries, score and box)
        scores, boxes = queries[..., 0], queries[..., 1:]
        order = torch.argsort((scores > 0).int(), dim=1, descending=True)
        return torch.take_along_dim(scores, order, dim=1), boxes.take_along_dim(order[..., None].expand(-1, -1, 4), 1)


def test_take_along_dim_as_gather_keeps_batch_and_queries_symbolic():
    model = _RankedQueries()
    axes = {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO}  # batch and queries
    exporter, config = exporters.exporter_for("dynamo", dynamic=True, dynamic_shapes={"queries": axes})

    def export():
        return exporter.export(model, {"queries": torch.randn(2, 5, 5)}, config)

    exported = export()
    assert "_patch_take_along_dim_as_gather" in exported.applied
    other = torch.randn(3, 7, 5)
    for got, expected in zip(exported(queries=other).values(), model(other)):
        torch.testing.assert_close(got, expected)
    with disabled_workarounds("_patch_take_along_dim_as_gather"):
        assert export().metadata["input_shapes"]["queries"] == [2, 5, 5]


@pytest.mark.parametrize("name, workaround, fixed_without", [
    ("RTDetrModel", "_patch_len_of_tensor_symbolic", ["pixel_values axis 0 = 2 (second set: 3)"]),
    ("DepthProModel", "_patch_len_of_tensor_symbolic", ["pixel_values axis 0 = 2 (second set: 3)"]),
    ("EsmForProteinFolding", "_patch_range_of_symbolic_batch_as_arange", [
        "input_ids axis 0 = 2 (second set: 3)", "attention_mask axis 0 = 2 (second set: 3)"]),
    ("Qwen2_5OmniToken2WavDiTModel", "_patch_len_of_tensor_symbolic", [  # its speaker pooling's mask
        f"{name} axis 0 = 2 (second set: 3)" for name in (
            "hidden_states", "condition_vector", "speaker_embedding", "quantized_code", "time_step")]),
])  # fmt: skip
def test_a_symbolic_batch_stays_where_the_code_reads_it_as_a_python_int(name, workaround, fixed_without):
    assert _fixed_axes_with_and_without(name, [workaround]) == {workaround: fixed_without}


def test_blt_hashes_the_same_byte_groups_by_gather_and_keeps_its_length_symbolic():
    from transformers.models.blt import modeling_blt

    from exporters.exporter_dynamo import _patch_blt_byte_groups_gathered

    original = modeling_blt.byte_group_hash_function
    gathered = _patch_blt_byte_groups_gathered(original)
    tokens = torch.randint(0, 260, (3, 9))
    for group_size in (2, 3, 8, 12):  # a group longer than the input too
        assert torch.equal(gathered(tokens, group_size, 1500450271, 500), original(tokens, group_size, 1500450271, 500))
    fixed = _fixed_axes_with_and_without("BltModel", ["_patch_blt_byte_groups_gathered"])
    assert fixed == {"_patch_blt_byte_groups_gathered": [
        "input_ids axis 1 = 7 (second set: 5)", "attention_mask axis 1 = 7 (second set: 5)"]}


class _ByteGroupHashes(torch.nn.Module):
    """BLT's hashes of byte n-grams, by three of its primes."""

    def forward(self, token_ids):
        from transformers.models.blt import modeling_blt

        groups = ((3, 1000000007), (5, 5915587277), (8, 9576080509))
        return torch.stack([modeling_blt.byte_group_hash_function(token_ids, size, prime, 500) for size, prime in groups])


def test_blt_hashes_wrap_around_int64_on_onnx_runtime_as_in_torch():
    """Powers of a prime near 1e9 past the second, and their weighted sums, overflow int64: torch wraps them, ONNX
    Runtime's integer Pow and ReduceSum do not (BLT's ONNX logits were 4.3 off)."""
    model, tokens = _ByteGroupHashes(), torch.randint(0, 260, (2, 9))
    exporter, config = exporters.exporter_for("onnx")
    (hashes,) = exporter.export(model, {"token_ids": tokens}, config)(token_ids=tokens).values()
    assert torch.equal(torch.as_tensor(hashes), model(tokens))
    with disabled_workarounds("_patch_blt_byte_groups_gathered"):
        (hashes,) = exporter.export(model, {"token_ids": tokens}, config)(token_ids=tokens).values()
    assert (torch.as_tensor(hashes) != model(tokens)).float().mean() > 0.5


DYNAMIC_CELL_CASES = [  # (model class, backend, {workaround: (stage, message) of its dynamic cell without it})
    # cuts its patch starts at a count of entropy peaks, on a dynamic axis
    ("BltForCausalLM", "executorch", {"_fix_slices_to_a_count_as_long_as_it": ("to-edge", "memo disaster")}),
    # SEW-D views its relative attention at a quotient of products of batch and frames (a chain of floors of the
    # samples): interval arithmetic bounded it 9,003 deep (345 MB in a 35 MB arena, refused at load); the exact
    # search runs over ~950,000 input sizes (batch 2 to 32 by 1,360 to 32,000 samples)
    ("SEWDModel", "executorch", {"_patch_sizes_bounded_exactly": ("load", "0x:21")}),
    # its blocks counted from the data: ExecuTorch plans memory for them only bounded by the patches given
    ("VideoLlama3VisionModel", "executorch",
     {"_patch_video_llama3_blocks_shrunk_at_once": ("torch-export", "Could not guard on data-dependent")}),
    # exported with 2 images of 16 patches, run with 3: the window-ordered rows were planned for 32
    ("Qwen2_5_VLModel", "executorch", {"_patch_window_order_sized_by_the_index": ("run", "0x12")}),
    # Qwen3-Omni's code predictor: head `length - 2` of a list of linears
    ("Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration", "dynamo",
     {"_patch_linear_picked_by_a_symbolic_index": ("dynamic-axes", "inputs_embeds axis 1 = 7 (second set: 5)")}),
    # its vision attention is flagged causal: eager, dropping the mask that hides nothing, attends causally
    ("Phi4MultimodalVisionModel", "dynamo",
     {"_patch_phi4_vision_mask_causal_when_it_hides_nothing": ("parity", "last_hidden_state (max abs 4.34)")}),
    # resizes its position grid image by image: the batch is fixed to the traced one
    ("Siglip2VisionModel", "dynamo",
     {"_patch_siglip2_positions_resized_as_tensors": ("dynamic-axes", "spatial_shapes axis 0 = 2 (second set: 3)")}),
    ("Lfm2VlModel", "dynamo",
     {"_patch_lfm2_vl_images_projected_at_once": ("dynamic-axes", "spatial_shapes axis 0 = 2 (second set: 3)")}),
    # counts its prompts with `len(input_ids)`
    ("CLIPSegForImageSegmentation", "dynamo",
     {"_patch_len_of_tensor_symbolic": ("dynamic-axes", "input_ids axis 0 = 2 (second set: 3)")}),
    # LFM3 (kernel 7) exported on a 7-token prompt meets a 5-token one, which eager pads
    ("Lfm3Model", "dynamo",
     {"_patch_conv_state_padded_to_its_kernel_always": ("run", "Guard failed: input_ids.size()[1] >= 7")}),
    # and on ONNX, which runs no guard: the 5-token prompt went through the branch of the 7-token one (with the patch,
    # contiguity asked of its padded state, `length + Max(0, 7 - length)`, had guarded that equal to 7)
    ("Lfm3Model", "onnx", {"_patch_conv_state_padded_to_its_kernel_always": ("parity", "outputs differ from eager")}),
    ("EncodecModel", "dynamo",
     {"_patch_encodec_one_chunk_as_one_offset": ("dynamic-axes", "input_values axis 2 = 8000")}),
    ("XcodecModel", "dynamo", {"_patch_conv1d_output_length_floor_divided": ("run", "Guard failed: math.trunc"),
                               "_patch_dim_constraints_unsolvable_left_as_guards": ("torch-export",
                                                                                    "solve_univariate_inequality")}),
    # exported on 2 samples of 7 tokens (padded by 1), run on 3 of 5 (padded by 3)
    ("ReformerModel", "dynamo",
     {"_patch_reformer_axial_positions_gathered": ("dynamic-axes", "input_ids axis 0 = 2 (second set: 3)"),
      "_patch_reformer_padding_written_over": ("run", "4 + -1 * (input_ids.size()[1] % 4) == 1")}),
    # SuperPoint's keypoints, image by image, in the matcher's two images per pair; then the matcher's empty branch
    ("SuperGlueForKeypointMatching", "dynamo",
     {"_patch_superpoint_keypoints_of_every_image_at_once": ("torch-export", "Eq(Max(u1, u3, u5, u7), 0)"),
      "_patch_keypoint_matching_of_two_keypoints_or_more": ("torch-export", "Eq(u0, 0)")}),
    # crops each image's tokens to its size, image by image
    ("Emu3Model", "dynamo", {"_patch_emu3_image_tokens_cropped_at_once": ("torch-export", "data-dependent")}),
    # pairs its videos' frames in Python ranges of their frame counts
    ("Ernie4_5_VLMoeModel", "dynamo", {"_patch_ernie_vl_frame_pairs_at_once": ("torch-export", "data-dependent")}),
    ("VideoLlama3Model", "dynamo",
     {"_patch_video_llama3_blocks_shrunk_at_once": ("torch-export", "data-dependent")}),
    ("HunYuanVLVisionTransformer", "dynamo",
     {"_patch_hunyuan_vl_images_merged_at_once": ("dynamic-axes", "grid_thw axis 0 = 2 (second set: 3)"),
      "_patch_hunyuan_vl_positions_resized_at_once": ("dynamic-axes", "grid_thw axis 0 = 2 (second set: 3)")}),
    ("GlmImageModel", "dynamo",
     {"_patch_glm_image_source_grids_by_mask": ("dynamic-axes", "images_per_sample axis 0 = 2 (second set: 3)"),
      "_patch_glm_image_features_as_one_map": ("torch-export", "data-dependent")}),
    # lists its chunks with a Python range up to the frame count
    ("Nemotron3DiarizationForAudioFrameClassification", "dynamo",
     {"_patch_nemotron_audio_of_one_chunk": ("run", "Guard failed")}),
    # walks its list of series one by one
    ("TimesFmModelForPrediction", "dynamo",
     {"_patch_timesfm_series_as_one_batch": ("dynamic-axes", "past_values axis 0 = 2 (second set: 3)")}),
    # splits its kept audio frames into chunks by sizes read with `.tolist()`
    ("Qwen2_5OmniThinkerModel", "dynamo", {"_patch_omni_audio_chunks_on_a_grid": ("torch-export", "data-dependent")}),
    # reads its token grid's height and width back from a tensor in every decoder layer
    ("Sam3LiteTextModel", "dynamo", {"_patch_sam3_box_bias_on_the_token_grid": ("torch-export", "data-dependent")}),
    # repeats each sample's units for their durations in a loop over the batch
    ("SeamlessM4TCodeHifiGan", "dynamo",
     {"_patch_seamless_m4t_units_repeated_at_once": ("dynamic-axes", "input_ids axis 0 = 2 (second set: 3)")}),
    # encodes its prompts one by one and reads its batch as `len(...)`
    ("OmDetTurboForObjectDetection", "dynamo",
     {"_patch_omdet_prompts_encoded_at_once": ("torch-export", "data-dependent"),
      "_patch_len_of_tensor_symbolic": ("dynamic-axes", "pixel_values axis 0 = 2 (second set: 3)")}),
]  # fmt: skip


@pytest.mark.parametrize("name, backend, failures", DYNAMIC_CELL_CASES, ids=[case[0] for case in DYNAMIC_CELL_CASES])
def test_a_dynamic_cell_passes_with_its_workarounds_and_fails_without_each(name, backend, failures):
    """``name``'s dynamic cell as the sweep runs it, with every workaround and with each one disabled: for models
    whose exported outputs are not eager's one for one (a tensor where eager returns None, cache leaves), the
    sweep's parity compares the outputs eager has."""
    from harness.cells import Cell, ClassContext, run_cell
    from harness.models import select

    model_class = select(name)[0]
    context = ClassContext(model_class)
    with_them = run_cell(Cell(model_class, backend, "dynamic"), context)
    assert (with_them.status, with_them.message) == ("pass", None) and set(failures) <= set(with_them.applied)
    for workaround, (stage, message) in failures.items():
        with disabled_workarounds(workaround):
            without = run_cell(Cell(model_class, backend, "dynamic"), context)
        assert without.stage == stage and message in without.message, workaround


def test_siglip2_positions_resized_as_tensors_are_eagers_for_every_grid():
    from transformers.models.siglip2.modeling_siglip2 import Siglip2VisionEmbeddings

    from exporters.exporter_dynamo import _patch_siglip2_positions_resized_as_tensors

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

    from exporters.exporter_dynamo import _patch_lfm2_vl_images_projected_at_once

    model = ClassContext(select("Lfm2VlModel")[0]).prepare().model
    original = type(model).get_image_features
    shapes = torch.tensor([[4, 6], [2, 2], [6, 4]])  # patch grids of three images, padded to 24 patches
    mask = (torch.arange(24)[None] < shapes.prod(-1)[:, None]).long()
    pixels = torch.randn(3, 24, model.config.vision_config.num_channels * model.config.vision_config.patch_size**2)
    with torch.no_grad():
        at_once = _patch_lfm2_vl_images_projected_at_once(original)(model, pixels, shapes, mask).pooler_output
        one_by_one = original(model, pixels, shapes, mask).pooler_output
    torch.testing.assert_close(torch.cat(at_once), torch.cat(one_by_one))


def test_vision_positions_at_once_are_eagers_image_by_image_and_keep_the_image_count_symbolic():
    from transformers.models.muse_spark.modeling_muse_spark import get_vision_position_ids

    from exporters.exporter_dynamo import _patch_vision_positions_at_once

    at_once = _patch_vision_positions_at_once(get_vision_position_ids)
    grids = torch.tensor([[1, 4, 6], [2, 2, 2], [1, 6, 4], [3, 2, 4]])  # images, and videos of 2 and 3 frames
    for merge, temporal in ((1, False), (2, False), (2, True)):
        torch.testing.assert_close(at_once(grids, merge, temporal), get_vision_position_ids(grids, merge, temporal))
    # ColQwen2 calls its Qwen2-VL tower directly, merge size 2: nothing precomputed reaches it
    fixed = _fixed_axes_with_and_without("ColQwen2ForRetrieval", ["_patch_vision_positions_at_once"])
    assert "image_grid_thw axis 0 = 2 (second set: 3)" in fixed["_patch_vision_positions_at_once"]


class _PositionedPatches(torch.nn.Module):
    """A Qwen-VL-style tower: every patch gets its (row, column), computed at once from the image grid."""

    def forward(self, patches, grid_thw):
        from transformers.models.muse_spark.modeling_muse_spark import get_vision_position_ids

        from exporters.exporter_dynamo import _patch_vision_positions_at_once

        positions = _patch_vision_positions_at_once(get_vision_position_ids)(grid_thw, 2)
        return patches + positions.to(patches.dtype).sum(-1, keepdim=True)


def test_executorch_plans_vision_positions_for_any_image_count():
    # no list of frames: its length, read from the data, would have no upper bound to plan memory for
    model = _PositionedPatches().eval()
    exporter, config = exporters.exporter_for("executorch", dynamic=True)
    inputs = {"patches": torch.randn(20, 3), "grid_thw": torch.tensor([[1, 2, 2], [2, 2, 4]])}
    exported = exporter.export(model, inputs, config)
    other = {"patches": torch.randn(16, 3), "grid_thw": torch.tensor([[1, 2, 2], [1, 2, 2], [2, 2, 2]])}
    (got,) = exported(**other).values()
    torch.testing.assert_close(got, model(**other))


def test_pixtral_patches_and_mistral3_blocks_picked_at_once_are_eagers_image_by_image():
    from harness.cells import ClassContext
    from harness.models import select

    from exporters.exporter_dynamo import _patch_patch_merger_blocks_gathered, _patch_pixtral_patches_picked_at_once

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


def test_the_gathered_window_order_is_the_reshaped_one():
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel as Tower

    from exporters.exporter_dynamo import _patch_window_order_sized_by_the_index

    tower = types.SimpleNamespace(spatial_merge_unit=4)
    rows, window_index = torch.randn(24, 5), torch.randperm(6)
    gathered = _patch_window_order_sized_by_the_index(None)(tower, rows, window_index, 24)
    assert torch.equal(gathered, Tower.permute_input_for_window_attn(tower, rows, window_index, 24))


@pytest.mark.parametrize("name, workaround, text", [
    ("MambaModel", "_patch_selective_scan_as_scan_op", "input_ids"),
    ("RecurrentGemmaModel", "_patch_rg_lru_scan_as_scan_op", "input_ids"),
    ("RwkvModel", "_patch_rwkv_attention_as_scan_op", "input_ids"),
    ("ParakeetForRNNT", "_patch_lstm_as_scan_op", "decoder_input_ids"),  # its prediction network
    ("xLSTMModel", "_patch_mlstm_inference_as_scan_op", "input_ids"),
])  # fmt: skip
def test_recurrences_over_time_keep_a_symbolic_length_as_scan_ops(name, workaround, text):
    fixed = _fixed_axes_with_and_without(name, [workaround])
    assert f"{text} axis 1 = 7 (second set: 5)" in fixed[workaround]


def test_mlstm_as_a_scan_is_the_chunkwise_form_past_a_whole_chunk():
    """Exported on 7 tokens, where eager loops step by step too; run on 70, where eager runs a chunk of 64 in its
    chunkwise form and 6 steps."""
    context = _built_by_the_sweep("xLSTMModel")
    assert context.model.config.chunk_size == 64
    exporter, config = exporters.exporter_for("dynamo", dynamic=True,
                                              dynamic_shapes={"input_ids": {1: torch.export.Dim.AUTO}})
    exported = exporter.export(context.model, {"input_ids": context.inputs["A"]["input_ids"]}, config)
    longer = torch.randint(0, context.model.config.vocab_size, (2, 70))
    with torch.no_grad():
        expected = context.model(input_ids=longer).last_hidden_state
    torch.testing.assert_close(exported(input_ids=longer)["last_hidden_state"], expected, atol=1e-4, rtol=1e-4)


# ONNX: a scan whose initial states alias is refused; ExecuTorch: a scan whose carries have a dynamic batch
@pytest.mark.parametrize("backend", ["dynamo", "onnx", "executorch"])
def test_lstm_as_scan_ops_is_the_lstm_in_both_directions_of_every_layer(backend):
    lstm = torch.nn.LSTM(6, 5, num_layers=2, bidirectional=True, batch_first=True).eval()
    batch, length = torch.export.Dim("batch", min=1, max=8), torch.export.Dim("length", min=2, max=64)
    exporter, config = exporters.exporter_for(backend, dynamic=True, dynamic_shapes={"input": {0: batch, 1: length}})

    def export():
        return exporter.export(lstm, {"input": torch.randn(2, 7, 6)}, config)

    exported = export()
    assert "_patch_lstm_as_scan_op" in exported.applied
    other = torch.randn(3, 11, 6)
    with torch.no_grad():
        output, (hidden, cell) = lstm(other)
    got = list(exported(input=other).values())
    for value, expected in zip(got, (output, hidden, cell)):
        torch.testing.assert_close(value, expected, atol=1e-5, rtol=1e-5)
    if backend == "executorch":
        assert "_patch_scan_carries_resized" in exported.applied
        with disabled_workarounds("_patch_scan_carries_resized"):
            copied = export()
        with pytest.raises(RuntimeError, match="0x12"):
            copied(input=other)


@pytest.mark.parametrize("backend", ["onnx", "executorch"])
def test_a_scan_lowers_in_its_inference_form(backend):
    """Mamba's selective scan as `scan` (`_patch_selective_scan_as_scan_op`): lowered with autograd on, the scan
    took its training form, whose saved sizes among its outputs failed the lowering."""
    from harness.cells import Cell, ClassContext, run_cell
    from harness.models import select

    model_class = select("MambaModel")[0]
    record = run_cell(Cell(model_class, backend, "dynamic"), ClassContext(model_class))
    assert (record.status, record.message) == ("pass", None)
    assert "_patch_selective_scan_as_scan_op" in record.applied


def test_funnel_relative_shift_as_a_gather_serves_every_length():
    from transformers.models.funnel.modeling_funnel import _relative_shift_gather

    from exporters.exporter_dynamo import _patch_funnel_relative_shift_indexed

    gathered = _patch_funnel_relative_shift_indexed(_relative_shift_gather)
    for seq_len, context_len, shift in ((7, 7, 1), (4, 7, 2), (3, 5, 2)):  # full length, and after pooling
        scores = torch.randn(2, 3, seq_len, 2 * context_len + shift - 1)
        expected = _relative_shift_gather(scores, context_len, shift)
        torch.testing.assert_close(gathered(scores, context_len, shift), expected)

    context, _, export = _exported_on_the_varying_axes("FunnelModel", ["_patch_funnel_relative_shift_indexed"])
    with disabled_workarounds("_patch_funnel_relative_shift_indexed"):
        reshaped = export()
    with pytest.raises(Exception, match="Guard failed"):
        reshaped(**context.inputs["B"])


@pytest.mark.parametrize("name, count_inputs", [
    ("Qwen3VLModel", ["image_grid_thw"]),  # per image, its deepstack features too
    ("Idefics3Model", ["pixel_values", "pixel_attention_mask"]),  # per sample
])  # fmt: skip
def test_the_image_count_stays_symbolic_where_features_are_split_per_image(name, count_inputs):
    split, fake_tolist = torch.Tensor.split, FakeTensor.tolist
    fixed = _fixed_axes_with_and_without(name, ["_patch_image_features_split_kept_whole"])
    assert sorted(fixed["_patch_image_features_split_kept_whole"]) == [
        f"{count_input} axis 0 = 2 (second set: 3)" for count_input in sorted(count_inputs)]
    # the tensor methods it replaces for the call are as they were
    assert "tolist" not in vars(torch.Tensor) and (torch.Tensor.split, FakeTensor.tolist) == (split, fake_tolist)


def test_csm_depth_decoder_keeps_a_symbolic_length_under_its_per_position_heads():
    fixed = _fixed_axes_with_and_without("CsmDepthDecoderForCausalLM", ["_patch_csm_codebook_heads_as_one_product"])
    assert "input_ids axis 1 = 7 (second set: 5)" in fixed["_patch_csm_codebook_heads_as_one_product"]


def test_cpmant_padding_mask_by_arange_is_the_listed_one():
    from transformers.models.cpmant.modeling_cpmant import CpmAntModel

    from exporters.exporter_dynamo import _patch_cpmant_padding_mask_by_arange

    model = _built_by_the_sweep("CpmAntModel").model
    by_arange = _patch_cpmant_padding_mask_by_arange(CpmAntModel._prepare_attention_mask)
    for seqlen in (model.prompt_length + 1, model.prompt_length + 6):
        input_ids = torch.zeros(3, seqlen, dtype=torch.long)
        context = torch.rand(3, seqlen) > 0.5
        span = (torch.rand(3, seqlen) > 0.8).cumsum(-1)
        length = torch.tensor([0, 1, seqlen - model.prompt_length])  # all padding, one real token, none
        expected = CpmAntModel._prepare_attention_mask(model, input_ids, span, context, length)
        assert torch.equal(by_arange(model, input_ids, span, context, length), expected)
    fixed = _fixed_axes_with_and_without("CpmAntModel", ["_patch_cpmant_padding_mask_by_arange"])
    assert "input_ids axis 1 = 7 (second set: 5)" in fixed["_patch_cpmant_padding_mask_by_arange"]


@pytest.mark.parametrize("name, workaround, guarded", [
    # Moonshine's decoder passes `is_causal=False` whenever it is handed a mask: a causal module all the same
    pytest.param("MoonshineModel", "_patch_moonshine_conv_lengths_floor_divided", "attention_mask", id="MoonshineModel"),
    pytest.param("NeuCodecModel", "_patch_neucodec_output_length_in_integers", "input_values", id="NeuCodecModel"),
    # SEW's upsampling, whatever the parity of its length
    pytest.param("SEWModel", "_patch_sew_upsampled_to_its_input_length", "input_values", id="SEWModel"),
    pytest.param("SEWDModel", "_patch_sew_upsampled_to_its_input_length", "input_values", id="SEWDModel"),
])  # fmt: skip
def test_an_audio_length_stays_symbolic(name, workaround, guarded):
    context, _, export = _exported_on_the_varying_axes(name, [workaround])
    with disabled_workarounds(workaround):
        fixed_length = export()
    with pytest.raises(Exception, match=f"Guard failed: .*{guarded}"):
        fixed_length(**context.inputs["B"])


def test_vits_pads_its_relative_positions_for_any_text_length():
    # exported on a text longer than the window (padded), matches eager on one that fits it (not padded)
    context, _, export = _exported_on_the_varying_axes("VitsModel", ["_patch_vits_relative_embeddings_padded_always"])
    window = next(module.window_size for module in context.model.modules() if hasattr(module, "window_size"))
    assert context.inputs["B"]["input_ids"].shape[1] <= window + 1 < context.inputs["A"]["input_ids"].shape[1]
    with disabled_workarounds("_patch_vits_relative_embeddings_padded_always"):
        branched = export()
    with pytest.raises(Exception, match="Guard failed: .*attention_mask"):  # the second text fits the window
        branched(**context.inputs["B"])


def test_forecast_masking_of_one_length_is_the_grouped_one():
    from transformers.models.patchtst.modeling_patchtst import forecast_masking

    from exporters.exporter_dynamo import _patch_forecast_masking_of_one_length

    by_comparison = _patch_forecast_masking_of_one_length(forecast_masking)
    inputs = torch.randn(5, 3, 8, 4)
    for unmasked_channels in (None, [1]):
        expected = forecast_masking(inputs, 3, unmasked_channels, mask_value=-1)
        for actual, wanted in zip(by_comparison(inputs, [3], unmasked_channels, mask_value=-1), expected):
            assert torch.equal(actual, wanted)
    fixed = _fixed_axes_with_and_without("PatchTSTForPretraining", ["_patch_forecast_masking_of_one_length"])
    assert fixed["_patch_forecast_masking_of_one_length"] == ["past_values axis 0 = 2 (second set: 3)"]


def test_music_flamingo_keeps_a_symbolic_batch_of_clips():
    name = "_patch_music_flamingo_rows_before_by_subtraction"
    fixed = _fixed_axes_with_and_without("MusicFlamingoModel", [name])
    clips = ("input_features", "input_features_mask")
    assert sorted(fixed[name]) == [f"{axis} axis 0 = 2 (second set: 3)" for axis in clips]


@pytest.mark.parametrize("name", ["VoxtralModel", "InklingModel"])
def test_placeholder_checks_by_count_export_with_a_symbolic_batch(name):
    _context, _, export = _exported_on_the_varying_axes(name, ["_patch_placeholder_count_checked_by_sum"])
    with disabled_workarounds("_patch_placeholder_count_checked_by_sum"):
        with pytest.raises(exporters.ExportError, match="not a subset of src_bound"):
            export()


def test_a_causal_mask_without_padding_is_skipped_as_eager_skips_it_for_a_module_that_is_not_causal():
    context = _built_by_the_sweep("Aimv2TextModel")  # non-causal attention modules, causal masks
    inputs = context.inputs["A"]
    exported = _export(context, "dynamo")
    assert "_patch_sdpa_skips_a_future_only_mask_as_eager_does" in exported.applied
    assert_parity(exported(**inputs), context.expected["A"], TOLERANCE["dynamo"])  # no padding: eager has no mask
    padded = dict(inputs, attention_mask=inputs["attention_mask"].clone())
    padded["attention_mask"][0, -2:] = 0  # with padding eager keeps the causal mask: so does the program
    assert_parity(exported(**padded), context._forward(padded), TOLERANCE["dynamo"])
    with disabled_workarounds("_patch_sdpa_skips_a_future_only_mask_as_eager_does"):
        causal = _export(context, "dynamo")
    with pytest.raises(AssertionError):
        assert_parity(causal(**inputs), context.expected["A"], TOLERANCE["dynamo"])


def test_attention_over_the_patches_a_mask_leaves_visible_exports_and_follows_the_mask():
    context = _built_by_the_sweep("VideoMAEForPreTraining")  # encodes the patches left visible
    inputs = context.inputs["A"]
    exported = _export(context, "dynamo")
    assert "_patch_sdpa_on_queries_counted_from_data" in exported.applied
    assert_parity(exported(**inputs), context.expected["A"], TOLERANCE["dynamo"])
    fewer_hidden = dict(inputs, bool_masked_pos=inputs["bool_masked_pos"].clone())
    for hidden in fewer_hidden["bool_masked_pos"]:  # two more visible in every sample: a longer encoded sequence
        hidden[hidden.nonzero()[:2, 0]] = False
    assert_parity(exported(**fewer_hidden), context._forward(fewer_hidden), TOLERANCE["dynamo"])
    with disabled_workarounds("_patch_sdpa_on_queries_counted_from_data"):
        with pytest.raises(exporters.DynamoExportError, match="data-dependent"):
            _export(context, "dynamo")


def test_masked_video_pre_training_runs_in_executorch():
    """Its decoder keeps the last `masked` tokens, a count read from the mask; attention then has strides summing
    the visible and the masked counts."""
    context = _built_by_the_sweep("VideoMAEForPreTraining")
    exported = _export(context, "executorch")
    assert {"_fix_tail_slice_of_a_count_from_the_front", "_patch_dim_order_of_contiguous_strides"} <= set(
        exported.applied)
    assert_parity(exported(**context.inputs["A"]), context.expected["A"], TOLERANCE["executorch"])


def test_contiguous_strides_that_sum_counts_read_from_data_are_in_order():
    from executorch.exir import tensor as executorch_tensor
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode, ShapeEnv

    shape_env = ShapeEnv()
    visible, masked = shape_env.create_unbacked_symint(), shape_env.create_unbacked_symint()
    for count in (visible, masked):
        torch._check(count >= 0)
    length = visible // 2 + masked // 2
    strides = (32 * length, 8 * length, 8, 1)  # (batch, heads, length, head size), contiguous
    with pytest.raises(GuardOnDataDependentSymNode, match=r"8\*\(\(u0//2\)\) \+ 8\*\(\(u1//2\)\) < 8"):
        executorch_tensor.dim_order_from_stride(strides)
    with apply_patches("executorch", select=lambda path: path == "executorch.exir.tensor.dim_order_from_stride"):
        assert executorch_tensor.dim_order_from_stride(strides) == (0, 1, 2, 3)


def test_canine_keeps_a_symbolic_length_through_its_local_attention_and_mask_pooling():
    workarounds = ["_patch_canine_local_attention_masked", "_patch_max_pool1d_by_windows"]
    fixed = _fixed_axes_with_and_without("CanineModel", workarounds)
    for workaround in workarounds:
        assert "input_ids axis 1 = 7 (second set: 5)" in fixed[workaround], workaround


def test_max_pooling_windows_that_tile_the_sequence_keep_its_length_symbolic():
    pool = torch.nn.MaxPool1d(3)
    length = torch.export.Dim("length", min=6, max=64)
    exporter, config = exporters.exporter_for("dynamo", dynamic=True, dynamic_shapes={"input": {2: length}})
    exported = exporter.export(pool, {"input": torch.randn(2, 4, 10)}, config)
    assert "_patch_max_pool1d_by_windows" in exported.applied
    longer = torch.randn(2, 4, 13)  # four windows, the last step left out as the pool leaves it
    torch.testing.assert_close(exported(input=longer)["output"], pool(longer))
    with disabled_workarounds("_patch_max_pool1d_by_windows"), pytest.raises(exporters.ExportError):
        exporter.export(pool, {"input": torch.randn(2, 4, 10)}, config)


def test_canine_local_attention_as_one_masked_attention_is_the_windowed_one():
    from transformers import CanineConfig
    from transformers.models.canine.modeling_canine import CanineAttention

    from exporters.exporter_dynamo import _patch_canine_local_attention_masked

    torch.manual_seed(0)
    config = CanineConfig(hidden_size=16, num_attention_heads=2)
    masked_forward = _patch_canine_local_attention_masked(CanineAttention.forward)
    for always_attend_to_first_position in (False, True):
        attention = CanineAttention(
            config, local=True, always_attend_to_first_position=always_attend_to_first_position,
            attend_from_chunk_width=3, attend_from_chunk_stride=3, attend_to_chunk_width=3, attend_to_chunk_stride=3,
        ).eval()  # fmt: skip
        hidden = torch.randn(2, 8, 16)  # three windows, the last one short
        padding = torch.ones(2, 8, 8)
        padding[1, :, 6:] = 0  # the second text ends inside the last window...
        padding[1, :, 3:6] = 0  # ...and a whole window of it is padding: its queries read padding only
        with torch.no_grad():
            expected = attention(hidden, padding)[0]
            got = masked_forward(attention, hidden, padding)[0]
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_omdet_turbo_program_encodes_the_prompts_it_is_given_not_those_eager_cached():
    context = _built_by_the_sweep("OmDetTurboForObjectDetection")  # its eager calls filled the prompt cache
    exported = _export(context, "dynamo")
    other_classes = dict(context.inputs["A"], classes_input_ids=context.inputs["A"]["classes_input_ids"].flip(0))
    with torch.no_grad():
        expected = context.model(**other_classes)
    got = exported(**other_classes)["decoder_class_logits"]
    assert not torch.allclose(got, context.expected["A"]["decoder_class_logits"]), "other classes, other scores"
    torch.testing.assert_close(got, expected.decoder_class_logits, atol=1e-4, rtol=1e-4)


def test_omdet_turbo_prompts_encoded_at_once_are_eagers_per_sample_classes():
    from exporters.exporter_dynamo import _patch_omdet_prompts_encoded_at_once

    context = _built_by_the_sweep("OmDetTurboForObjectDetection")
    model, inputs = context.model, context.inputs["A"]
    classes_structure = torch.tensor([3, 1, 2])  # samples with more classes than others: padded with zeros
    classes_input_ids = torch.randint(1, 90, (6, inputs["classes_input_ids"].shape[1]))
    prompts = (classes_input_ids, torch.ones_like(classes_input_ids), inputs["tasks_input_ids"][[0, 1, 0]],
               inputs["tasks_attention_mask"][[0, 1, 0]], classes_structure)
    original = type(model).get_language_embedding
    with torch.no_grad():
        one_by_one = original(model, *prompts)
        at_once = _patch_omdet_prompts_encoded_at_once(original)(model, *prompts)
    assert one_by_one[0].shape == (3, 3, model.config.class_embed_dim)
    for got, expected in zip(at_once, one_by_one, strict=True):
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("confidence_bias, layers_kept", [
    (2.2, {1, 2}),  # confident enough to prune at the first layer, not to stop: pairs go on with fewer keypoints
    (3.0, {1}),  # every pair stops at the first layer
])
def test_lightglue_stopping_and_pruning_by_masks_is_eagers(confidence_bias, layers_kept):
    """Eager's own LightGlue crashes when only some pairs stop before its last layer (it builds the last layer's
    stops for the whole batch), so the cases it runs: pruning without stopping, and every pair stopping at once."""
    from harness.cells import varying_axes

    context = _built_by_the_sweep("LightGlueForKeypointMatching")
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


class _TokensPastTheLastWindow(torch.nn.Module):
    """DeepSeek V4's compressor: windows of 4 tokens pooled, the tokens past the last one kept for the next call."""

    def forward(self, hidden):
        usable = hidden.shape[1] // 4 * 4
        return hidden[:, :usable].sum(1), hidden[:, usable:]


def test_contiguity_of_a_symbolic_size_is_recorded_without_a_guard():
    model = _TokensPastTheLastWindow()
    exporter, config = exporters.exporter_for("dynamo", dynamic=True)
    traced_on, run_on = torch.randn(2, 7, 3), torch.randn(2, 5, 3)  # 3 tokens left over, then 1
    exported = exporter.export(model, {"hidden": traced_on}, config)
    assert "_patch_contiguity_asked_without_guards" in exported.applied
    for got, expected in zip(exported(hidden=run_on).values(), model(run_on), strict=True):
        torch.testing.assert_close(got, expected)
    with disabled_workarounds("_patch_contiguity_asked_without_guards"):
        as_guarded = exporter.export(model, {"hidden": traced_on}, config)
    with pytest.raises(AssertionError, match=r"hidden.size\(\)\[1\] \+ -4 \* \(hidden.size\(\)\[1\] // 4\) != 1"):
        as_guarded(hidden=run_on)


class _NeighbourSums(torch.nn.Module):
    """Sums of neighbouring offsets through `unfold`, which `to_edge` decomposes into a slice of `count - 1`."""

    def forward(self, offsets):
        return offsets.unfold(0, 2, 1).sum(-1)


def test_executorch_retrace_asks_contiguity_without_a_guard():
    model, traced_on, run_on = _NeighbourSums(), torch.tensor([0.0, 4.0]), torch.tensor([0.0, 4.0, 9.0])
    exporter, config = exporters.exporter_for("executorch", dynamic=True)
    exported = exporter.export(model, {"offsets": traced_on}, config)
    assert "_patch_contiguity_asked_without_guards" in exported.applied
    (got,) = exported(offsets=run_on).values()
    torch.testing.assert_close(got, model(run_on))
    with disabled_workarounds("_patch_contiguity_asked_without_guards"):
        as_guarded = exporter.export(model, {"offsets": traced_on}, config)
    assert as_guarded.metadata["input_shapes"]["offsets"] == [2]  # `count - 1 < 2` fixed the count
    with pytest.raises(RuntimeError, match="0x10"):
        as_guarded(offsets=run_on)


class _KeptWhileRunning(torch.nn.Module):
    """LightGlue's keypoint mask: the pruned one for the pairs still running, the one they had for the others."""

    def forward(self, running, kept, live):
        return torch.where(running, kept, live)


def test_onnx_runtime_chooses_between_masks_by_logic():
    model = _KeptWhileRunning()
    inputs = {"running": torch.tensor([[True], [False]]), "kept": torch.tensor([[True, False, False]] * 2),
              "live": torch.tensor([[True, True, False]] * 2)}
    exporter, config = exporters.exporter_for("onnx", dynamic=True)
    exported = exporter.export(model, inputs, config)
    assert "_fix_ir_where_on_booleans" in exported.applied
    other = {name: torch.cat([value, ~value]) for name, value in inputs.items()}  # another batch
    (got,) = exported(**other).values()
    assert torch.equal(torch.as_tensor(got), model(**other))
    with disabled_workarounds("_fix_ir_where_on_booleans"):
        as_converted = exporter.export(model, inputs, config)
    with pytest.raises(Exception, match="implementation for Where"):
        as_converted(**inputs)


class _ChunkSolve(torch.nn.Module):
    def forward(self, system, values):
        return torch.linalg.solve_triangular(system, values, upper=False, unitriangular=True)


@pytest.mark.parametrize("backend, error", [("onnx", "linalg_solve_triangular"), ("executorch", "SpecViolationError")])
def test_a_unit_triangular_solve_is_exported_as_products(backend, error):
    model, inputs = _ChunkSolve(), {"system": torch.randn(2, 64, 64) * 0.2, "values": torch.randn(2, 64, 3)}
    exporter, config = exporters.exporter_for(backend)
    exported = exporter.export(model, inputs, config)
    assert "_patch_unit_triangular_solve_as_products" in exported.applied
    other = {"system": torch.randn(2, 64, 64) * 0.2, "values": torch.randn(2, 64, 3)}
    (got,) = exported(**other).values()
    torch.testing.assert_close(torch.as_tensor(got), model(**other), atol=1e-4, rtol=1e-4)
    with disabled_workarounds("_patch_unit_triangular_solve_as_products"), pytest.raises(Exception, match=error):
        exporter.export(model, inputs, config)


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


def _row_updates(exported):
    """Steps of a row-by-row inverse: each writes one row of a chunk's triangular system."""
    return sum(node.target is torch.ops.aten.copy_.default for node in exported.program.graph.nodes)


CHUNK_SIZE = 64  # delta rule layers' default chunk, which they do not change


def test_the_delta_rule_is_traced_as_eagers_solve_not_row_by_row():
    _, as_eager, export = _exported_on_the_varying_axes("Qwen3NextModel", ["_patch_delta_rule_solves_as_eager",
                                                                           "_patch_unit_triangular_solve_as_products"])
    with disabled_workarounds("_patch_delta_rule_solves_as_eager"):
        row_by_row = export()
    assert _row_updates(row_by_row) - _row_updates(as_eager) == CHUNK_SIZE - 1


def test_kimi_delta_attention_takes_one_chunk_as_long_as_a_static_text():
    context = _built_by_the_sweep("BailingHybridModel")
    exporter, config = exporters.exporter_for("dynamo")
    exported = exporter.export(context.model, context.inputs["A"], config)
    assert "_patch_kimi_delta_chunks_fit_a_static_text" in exported.applied
    assert_parity(exported(**context.inputs["A"]), context.expected["A"], TOLERANCE["dynamo"])
    with disabled_workarounds("_patch_kimi_delta_chunks_fit_a_static_text"):
        in_model_chunks = exporter.export(context.model, context.inputs["A"], config)
    length = context.inputs["A"]["input_ids"].shape[1]
    assert _row_updates(in_model_chunks) - _row_updates(exported) == (CHUNK_SIZE - 1) - (length - 1)


class _TaskPrompts(torch.nn.Module):
    def __init__(self, language_backbone):
        super().__init__()
        self.language_backbone = language_backbone

    def forward(self, input_ids, attention_mask):
        return self.language_backbone(input_ids, mask=attention_mask, encode_type="task")


def test_omdet_turbo_task_prompts_are_cut_within_the_mask_for_executorch():
    """On a symbolic width: the general count fix bounds the mask's count by the mask's width, but the encoded
    tokens have their own width symbol (two inputs), so `to_edge` still asks whether the count passes it; the patch
    picks the tokens by position instead of slicing them."""
    context = _built_by_the_sweep("OmDetTurboForObjectDetection")
    model = _TaskPrompts(context.model.language_backbone).eval()

    def prompts(width):
        input_ids = context.inputs["A"]["tasks_input_ids"][:, :1].repeat(1, width)
        attention_mask = torch.ones_like(input_ids)
        attention_mask[:, -2:] = 0  # every prompt two tokens shorter than the batch is wide
        return {"input_ids": input_ids, "attention_mask": attention_mask}

    wide = {name: {1: torch.export.Dim.AUTO} for name in ("input_ids", "attention_mask")}
    exporter, config = exporters.exporter_for("executorch", dynamic=True, dynamic_shapes=wide)
    exported = exporter.export(model, prompts(7), config)
    assert "_patch_omdet_task_prompts_cut_within_the_mask" in exported.applied
    for width in (7, 5):
        with torch.no_grad():
            expected = model(**prompts(width))
        assert expected[1].shape[1] == width - 2
        for got, want in zip(exported(**prompts(width)).values(), expected, strict=True):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    with disabled_workarounds("_patch_omdet_task_prompts_cut_within_the_mask"):
        with pytest.raises(exporters.ExportError, match=r"u\d+ > s\d+"):
            exporter.export(model, prompts(7), config)


def test_esmfold_traces_with_a_symbolic_batch_once_its_identity_frames_are_made_afresh():
    context = _built_by_the_sweep("EsmForProteinFolding")
    exported = _export(context, "dynamo", dynamic=True)
    assert "_patch_identity_frames_uncached" in exported.applied
    assert_parity(exported(**context.inputs["A"]), context.expected["A"], TOLERANCE["dynamo"])
    with disabled_workarounds("_patch_identity_frames_uncached"):
        with pytest.raises(exporters.ExportError, match="unhashable"):
            _export(context, "dynamo", dynamic=True)


def test_eomt_mask_annealing_is_read_as_the_numbers_its_buffer_holds(monkeypatch):
    context = _built_by_the_sweep("EomtForUniversalSegmentation")
    model, inputs = context.model, context.inputs["A"]
    state_keys = list(model.state_dict())
    model.attn_mask_probs[0] = 0.0  # the first masked block annealed away: its queries see the whole image
    expected = context._forward(inputs)
    assert not torch.allclose(expected["class_queries_logits"], context.expected["A"]["class_queries_logits"])
    exported = _export_module(model, inputs, "dynamo")
    assert_parity(exported(**inputs), expected, TOLERANCE["dynamo"])
    assert list(model.state_dict()) == state_keys and "attn_mask_probs" in model._buffers
    monkeypatch.setattr("exporters.exporter_dynamo._BUFFERS_READ_AS_NUMBERS", ())
    with pytest.raises(exporters.ExportError, match="data-dependent"):
        _export_module(model, inputs, "dynamo")


def test_vilt_patches_kept_in_place_answer_like_eager_for_images_of_other_extents():
    context = _built_by_the_sweep("ViltForQuestionAnswering")
    torch.nn.init.normal_(context.model.vilt.embeddings.position_embeddings)  # positions that move the pooled state
    inputs = dict(context.inputs["A"])
    batch, _channels, height, width = inputs["pixel_values"].shape
    whole = torch.ones(batch, height, width, dtype=torch.long)
    inputs["pixel_mask"] = whole.clone()
    inputs["pixel_mask"][1, height // 2:] = 0  # the second image: 2 x 3 of the 4 x 4 patches, its table resized to it
    inputs["pixel_mask"][1, :, width * 3 // 4:] = 0
    fired = set()
    with torch.no_grad():
        eager = context.model.vilt(**inputs).pooler_output  # its patch states come in a random order
        assert not torch.allclose(eager, context.model.vilt(**dict(inputs, pixel_mask=whole)).pooler_output, atol=1e-4)
        with apply_patches("dynamo", fired):
            in_place = context.model.vilt(**inputs).pooler_output
    assert "_patch_vilt_patches_in_place" in fired
    torch.testing.assert_close(in_place, eager, atol=1e-6, rtol=1e-5)


def test_qwen4_indexer_by_masks_keeps_the_blocks_the_loop_keeps():
    """40 keys make 10 blocks of which a query keeps 2: the ranking decides. Eight indexer heads and no padding
    token ids, so that no query's scores tie."""
    import copy

    from exporters.utils import apply_patches

    tiny = _built_by_the_sweep("Qwen4ExpTextModel").model
    config = copy.deepcopy(tiny.config)
    config.indexer_n_heads = 8
    torch.manual_seed(0)
    model = type(tiny)(config).eval()
    input_ids = torch.randint(1, config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :5] = 0
    fired = set()
    with torch.no_grad():
        loop = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        with apply_patches("dynamo", fired):
            masks = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    assert "_patch_qwen4_indexer_by_masks" in fired
    torch.testing.assert_close(masks, loop, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("end_bias, steps", [(0.0, 9), (100.0, 1)])  # no row ends; every row ends at once
def test_table_decode_is_cut_where_eager_stops(end_bias, steps):
    context = _built_by_the_sweep("SLANetSLAHead")
    model, inputs = context.model, context.inputs["A"]
    model.structure_generator.fc2.bias.data[-1] += end_bias  # the last class is the end token
    expected = context._forward(inputs)
    assert expected["last_hidden_state"].shape[1] == steps
    assert_parity(_export_module(model, inputs, "dynamo")(**inputs), expected, TOLERANCE["dynamo"])


@pytest.mark.parametrize("module", ["qwen3_asr", "qwen3_omni_moe"])
def test_padded_audio_windows_split_the_frames_as_the_loop_does(module):
    import importlib

    from exporters.exporter_dynamo import _patch_audio_windows_padded

    looped = importlib.import_module(f"transformers.models.{module}.modeling_{module}").get_audio_cu_seqlens
    padded = _patch_audio_windows_padded(looped)
    n_window, n_window_infer, chunk = 4, 32, 8  # windows of 4 chunks
    for frames in ([64, 40, 9], [8, 8], [33, 64, 1, 17]):
        chunks = -(-max(frames) // chunk)
        mask = torch.tensor([[1] * length + [0] * (chunks * chunk - length) for length in frames])
        chunk_lengths, feature_lens = mask.view(len(frames), chunks, chunk).sum(-1).flatten(), mask.sum(-1)
        boundaries = [f(chunk_lengths, feature_lens, n_window_infer, n_window) for f in (looped, padded)]
        assert boundaries[0][-1] == boundaries[1][-1]
        positions = torch.arange(int(boundaries[0][-1]))
        same_window = [(s := (positions[:, None] >= b[None, 1:]).sum(-1))[:, None] == s[None] for b in boundaries]
        assert torch.equal(*same_window)
        assert len(boundaries[1]) == len(frames) * len(chunk_lengths) + 1  # a count the frames do not decide


def test_phi4_streaming_mask_by_argmax_matches_the_nonzero_one():
    import numpy as np
    from transformers.models.phi4_multimodal import modeling_phi4_multimodal as phi4

    from exporters.exporter_dynamo import _patch_streaming_mask_by_argmax

    by_argmax = _patch_streaming_mask_by_argmax(phi4.adaptive_enc_mask)
    for frames, chunk, left, right in ((20, 6, 1, 0), (20, 6, 0, 1), (18, 4, 18, 0), (7, 7, 2, 2)):
        starts = np.arange(0, frames, chunk)
        assert torch.equal(by_argmax(frames, starts, left, right), phi4.adaptive_enc_mask(frames, starts, left, right))
    streaming = _patch_streaming_mask_by_argmax(phi4.Phi4MultimodalAudioModel._streaming_mask)
    model = _built_by_the_sweep("Phi4MultimodalAudioModel").model
    for chunk in (-1, 4):  # -1: the whole sequence is one chunk
        expected = phi4.Phi4MultimodalAudioModel._streaming_mask(model, 13, 2, chunk, 1)
        assert torch.equal(streaming(model, 13, 2, chunk, 1), expected)


def _global_tokens_in_one_sample(inputs):
    inputs["global_attention_mask"][:] = 0
    inputs["global_attention_mask"][1, :3] = 1


def _visual_indicators_after_the_image(inputs):
    inputs["input_ids"][:, -6:-1] = torch.tensor([122, 123, 124, 125, 126])  # Ovis2's indicator ids, tiny


def _a_whole_number_of_windows(inputs):  # which LED pads by a whole window, where eager pads nothing
    for name, value in inputs.items():
        inputs[name] = value[:, :4]


def test_the_gathered_length_regulator_repeats_like_the_loop():
    from transformers.models.fastspeech2_conformer import modeling_fastspeech2_conformer as fastspeech2

    from exporters.exporter_dynamo import _patch_length_regulator_gathered

    gathered = _patch_length_regulator_gathered(fastspeech2.length_regulator)
    embeddings = torch.randn(3, 4, 5)
    for durations in ([[1, 0, 2, 3], [0, 0, 0, 0], [2, 2, 1, 0]], [[0, 0, 0, 0]] * 3, [[3, 1, 0, 2]] * 3):
        durations = torch.tensor(durations)  # the loop sets the durations of silent rows in place
        assert torch.equal(gathered(embeddings, durations.clone()), fastspeech2.length_regulator(embeddings, durations))


def test_seamless_m4t_vocoder_units_repeated_at_once_are_eagers_sample_by_sample():
    from exporters.exporter_dynamo import _patch_seamless_m4t_units_repeated_at_once

    context = _built_by_the_sweep("SeamlessM4TCodeHifiGan")
    model, inputs = context.model, context.inputs["A"]
    model.dur_predictor.proj.weight.data *= 10  # units of 1 to a few frames: rows of unequal lengths, padded
    original = type(model).forward
    at_once = _patch_seamless_m4t_units_repeated_at_once(original)
    generator = torch.Generator().manual_seed(0)
    for batch, length in ((1, 6), (2, 4), (3, 9)):  # one sample takes eager's other branch
        units = torch.randint(4, model.config.unit_hifi_gan_vocab_size, (batch, length), generator=generator)
        speakers, languages = inputs["spkr_id"][:1].expand(batch, -1), inputs["lang_id"][:1].expand(batch, -1)
        with torch.no_grad():
            expected, got = (forward(model, units, speakers, languages) for forward in (original, at_once))
        for value, reference in zip(got, expected, strict=True):
            torch.testing.assert_close(value, reference)


@pytest.mark.parametrize("name, workaround, vary", [
    ("LongformerForMaskedLM", "_patch_longformer_attention_dense", _global_tokens_in_one_sample),
    ("LEDForQuestionAnswering", "_patch_longformer_attention_dense", _global_tokens_in_one_sample),
    ("LEDModel", "_patch_led_pads_at_least_one_token", _a_whole_number_of_windows),
    ("ReformerModelWithLMHead", "_patch_reformer_padding_bucket_as_tensors", None),
    ("FunnelForMaskedLM", "_patch_funnel_positions_by_their_ends", None),
    ("Ovis2Model", "_patch_ovis2_visual_indicators_by_where", _visual_indicators_after_the_image),
])  # fmt: skip
def test_a_rewritten_branch_matches_the_original_on_padded_inputs(name, workaround, vary):
    """The inputs of the sweep with padding (and whatever else ``vary`` changes): eager with the patch installed."""
    from exporters.utils import apply_patches

    context = _built_by_the_sweep(name)
    inputs = {key: value.clone() for key, value in context.inputs["A"].items()}
    inputs["attention_mask"][0, -2:] = 0
    if vary:
        vary(inputs)
    fired = set()
    with torch.no_grad():
        original = exporters.named_leaves(context.model(**inputs))
        with apply_patches("dynamo", fired):
            rewritten = exporters.named_leaves(context.model(**inputs))
    assert workaround in fired
    assert_parity(rewritten, original, TOLERANCE["dynamo"])


def test_funnel_keeps_its_sequence_axis_dynamic():
    """Its positions were a Python list as long as the sequence, which fixed the length in the trace."""
    context = _built_by_the_sweep("FunnelForMaskedLM")
    exported = _export(context, "dynamo", dynamic=True)
    assert "_patch_funnel_positions_by_their_ends" in exported.applied
    assert isinstance(exported.metadata["input_shapes"]["input_ids"][1], str)  # a symbol
    with disabled_workarounds("_patch_funnel_positions_by_their_ends"):
        length_fixed = _export(context, "dynamo", dynamic=True)
    assert length_fixed.metadata["input_shapes"]["input_ids"][1] == context.inputs["A"]["input_ids"].shape[1]


DYNAMIC_CASES = [  # (model class, workaround, the input whose axis it keeps dynamic)
    ("Wav2Vec2ForXVector", "_patch_xvector_masked_statistics", "attention_mask"),  # pooled sample by sample
    ("LlavaForConditionalGeneration", "_patch_llava_features_as_one_image", "pixel_values"),  # a list per image
    ("LEDModel", "_patch_led_pads_at_least_one_token", "input_ids"),  # padded to the window by the length's remainder
]


@pytest.mark.parametrize("name, workaround, input_name", DYNAMIC_CASES, ids=[case[1] for case in DYNAMIC_CASES])
def test_a_model_keeps_its_axes_dynamic_with_its_workaround(name, workaround, input_name):
    context = _built_by_the_sweep(name)
    second = context.inputs["B"]
    assert second[input_name].shape != context.inputs["A"][input_name].shape
    exported = _export(context, "dynamo", dynamic=True)
    assert_parity(exported(**second), context.expected["B"], TOLERANCE["dynamo"])
    with disabled_workarounds(workaround):
        batch_fixed = _export(context, "dynamo", dynamic=True)
    with pytest.raises(Exception, match=input_name):
        batch_fixed(**second)


class _CheckedTokens(torch.nn.Module):
    """A vision-language model's prefill checks its image-token mask with a tensor condition."""

    def forward(self, input_ids):
        torch._check_tensor_all(input_ids >= 0, lambda: "image tokens and features do not match")
        return input_ids.float() * 2


class _SameEosCount(torch.nn.Module):
    """T5's classification head: every example must hold as many EOS tokens."""

    def forward(self, input_ids):
        torch._check(torch.unique_consecutive((input_ids == 1).sum(dim=1)).numel() == 1)
        return input_ids.float() * 2


class _InvertedMask(torch.nn.Module):
    """XLNet's input mask: a number minus the integer attention mask."""

    def forward(self, attention_mask):
        return 1.0 - attention_mask


class _TransposedAndItsCopy(torch.nn.Module):
    """RecurrentGemma's convolution output: transposed, and a contiguous copy of it taken as well."""

    def forward(self, x):
        transposed = (x * 2).transpose(1, 2)
        return transposed, transposed.contiguous()


class _AttentionSinkMax(torch.nn.Module):
    """GPT-OSS's attention sinks: scores shifted by their maximum over the last axis, counted from the end."""

    def forward(self, scores):
        return scores - scores.max(dim=-1, keepdim=True).values


def test_executorch_attention_sinks_softmax_matches_eager():
    # XNNPACK lowered the 4-D max it took, and the softmax after it came out 0.9 off: the max is left to it no more
    model, scores = _AttentionSinkMax().eval(), torch.randn(2, 4, 7, 8)
    exporter, config = exporters.exporter_for("executorch")
    exported = exporter.export(_Softmaxed(model), {"scores": scores}, config)
    assert "_fix_max_for_xnnpack" in exported.applied
    torch.testing.assert_close(exported(scores=scores)["output"], torch.softmax(model(scores), -1), atol=1e-5, rtol=1e-5)


class _TinyEpsilonNorm(torch.nn.Module):
    """A norm whose epsilon sits below the ONNX optimizer's tolerance for zero (Muse Spark's audio tower)."""

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-8)


def test_the_onnx_optimizer_keeps_an_epsilon_below_its_zero_tolerance():
    model, x = _TinyEpsilonNorm().eval(), torch.randn(2, 8) * 1e-5  # a mean square of 1e-10: the epsilon dominates
    exporter, config = exporters.exporter_for("onnx")
    exported = exporter.export(model, {"x": x}, config)
    assert "_patch_optimizer_zero_means_zero" in exported.applied
    torch.testing.assert_close(exported(x=x)["output"], model(x), atol=1e-5, rtol=1e-4)
    with disabled_workarounds("_patch_optimizer_zero_means_zero"):
        without_epsilon = exporter.export(model, {"x": x}, config)
    assert not torch.allclose(without_epsilon(x=x)["output"], model(x), atol=1e-3, rtol=1e-2)


class _Softmaxed(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, scores):
        return torch.softmax(self.inner(scores), dim=-1)


class _StridePool(torch.nn.Module):
    """Hiera's pooling: the maximum over the stride axis of a 4-D view, that axis dropped."""

    def forward(self, tokens):
        return tokens.view(2, 4, -1, 8).max(dim=1).values


class _PatchIndexPerImage(torch.nn.Module):
    """Inkling 2's vision tower: each image's patch index shifted by the image's number, repeated per patch."""

    def forward(self, patches, patches_per_image):
        image_ids = torch.arange(1, patches_per_image.shape[0] + 1)
        index = torch.arange(patches.shape[0]) + torch.repeat_interleave(image_ids, patches_per_image)
        return patches + index[:, None]


class _PickedColumns(torch.nn.Module):
    """Columns picked by a mask from the input (image-token positions): a data-dependent size in a middle axis."""

    def forward(self, x, keep):
        return x[:, keep] * 2


class _ScoreAtFirstBest(torch.nn.Module):
    """ESMFold's pTM: the score at the coordinates of the first maximum, which `nonzero` finds."""

    def forward(self, scores):
        best = (scores == scores.max()).nonzero()[0]
        return scores[tuple(best)] * 2


class _SilencedNoise(torch.nn.Module):
    """VITS's prior sampler with its noise scale at 0, and its duration predictor's noise of a given size."""

    def forward(self, means, log_variances):
        noise = torch.randn(means.shape[0], 1, means.shape[2]) * 0.0
        return means + torch.randn_like(means) * torch.exp(log_variances) * 0.0 + noise


class _MaskedTail(torch.nn.Module):
    """VideoMAE's decoder: the last `masked` tokens, their count read from the mask."""

    def forward(self, tokens, masked):
        return tokens[:, -masked.nonzero().shape[0]:] * 2


class _VideoConvolution(torch.nn.Module):
    """Emu3's video VQ-VAE: a 3-D convolution that pads and strides unlike its kernel (no patch embedding)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv3d(4, 6, kernel_size=3, stride=(1, 2, 2), padding=1)

    def forward(self, video):
        return self.conv(video)


class _Tubelets(torch.nn.Module):
    """VideoMAE's and Qwen-VL's patch embedding: a 3-D convolution whose stride is its kernel."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Conv3d(3, 8, kernel_size=(2, 4, 4), stride=(2, 4, 4))

    def forward(self, video):
        return self.proj(video)


class _InterpolationTaps(torch.nn.Module):
    """Kimi-K2.5's position embedding: interpolation taps gathered and weighted as fixed-size bags."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(16, 8))

    def forward(self, indices, weights):
        return torch.nn.functional.embedding_bag(indices, self.table, per_sample_weights=weights, mode="sum")


class _NoiseRanks(torch.nn.Module):
    """ViTMAE's random masking argsorts its noise; SAM-HQ sorts its point scores."""

    def forward(self, noise):
        return torch.sort(noise, dim=1, descending=True).values + torch.argsort(noise, dim=1)


class _SegmentMinimum(torch.nn.Module):
    """TAPAS: the smallest value in each segment of the table (segment 3 has none and keeps its zero)."""

    def forward(self, values, segments):
        return torch.zeros(5).scatter_reduce(0, segments, values, "amin", include_self=False)


class _PatchMaxima(torch.nn.Module):
    """BLT: each patch's states, the largest over its bytes' (patch 2 has none and keeps its zero)."""

    def forward(self, states, patches):
        index = patches.unsqueeze(-1).expand(-1, -1, states.shape[-1])
        return torch.zeros(states.shape[0], 4, states.shape[-1]).scatter_reduce(1, index, states, "amax",
                                                                                 include_self=False)


class _TimeShift(torch.nn.Module):
    """RWKV: every step sees the previous one, padded in front and cropped at the end."""

    def __init__(self):
        super().__init__()
        self.shift = torch.nn.ZeroPad2d((0, 0, 1, -1))

    def forward(self, hidden_states):
        return self.shift(hidden_states) + hidden_states


RUNTIME_CASES = [  # (module, inputs, workaround, what the ExecuTorch runtime says without it)
    (_Tubelets, {"video": torch.randn(2, 3, 4, 8, 12)}, "_fix_patchify_conv3d", "0x12"),  # 3-D and 4-D only
    (_Tubelets, {"video": torch.randn(2, 3, 5, 9, 14)}, "_fix_patchify_conv3d", "0x12"),  # leftovers uncovered
    (_InterpolationTaps, {"indices": torch.randint(0, 16, (5, 4)), "weights": torch.rand(5, 4)},
     "_patch_embedding_bag_as_gather", "no kernel for aten::_embedding_bag"),
    (_NoiseRanks, {"noise": torch.randn(2, 9)}, "_fix_sort_as_topk", "no kernel for aten::sort"),
    (_TimeShift, {"hidden_states": torch.randn(2, 5, 4)}, "_fix_negative_padding_as_slice", "0x12"),
    (_SegmentMinimum, {"values": torch.randn(7), "segments": torch.tensor([0, 2, 2, 4, 0, 2, 1])},
     "_patch_scatter_reduce_as_dense", "no kernel for aten::scatter_reduce"),
    (_PatchMaxima, {"states": torch.randn(2, 6, 3), "patches": torch.tensor([[0, 0, 1, 1, 3, 3], [0, 1, 1, 1, 1, 3]])},
     "_patch_scatter_reduce_as_dense", "no kernel for aten::scatter_reduce"),
    (_VideoConvolution, {"video": torch.randn(2, 4, 5, 8, 8)}, "_patch_conv3d_as_frames_of_conv2d", "0x12"),
]  # fmt: skip


def test_executorch_embeds_tubelets_of_a_video_whose_sizes_are_symbolic():
    model, traced = _Tubelets().eval(), {"video": torch.randn(2, 3, 4, 8, 12)}
    exported = _executorch_dynamic(model, traced)
    assert "_patch_conv3d_as_frames_of_conv2d" in exported.applied
    other = torch.randn(3, 3, 6, 12, 8)
    (got,) = exported(video=other).values()
    torch.testing.assert_close(got, model(other), atol=1e-5, rtol=1e-5)
    with disabled_workarounds("_patch_conv3d_as_frames_of_conv2d"):
        as_traced = _executorch_dynamic(model, traced)
    with pytest.raises(RuntimeError, match="0x12"):  # 3-D and 4-D inputs only
        as_traced(**traced)


@pytest.mark.parametrize("module, inputs, workaround, error", RUNTIME_CASES, ids=[c[2] for c in RUNTIME_CASES])
def test_a_pattern_the_executorch_runtime_cannot_run_is_rewritten(module, inputs, workaround, error):
    model = module().eval()
    exporter, config = exporters.exporter_for("executorch")
    exported = exporter.export(model, inputs, config)
    assert workaround in exported.applied
    (got,) = exported(**inputs).values()
    torch.testing.assert_close(got, model(**inputs), atol=1e-5, rtol=1e-5)
    with disabled_workarounds(workaround):
        as_traced = exporter.export(model, inputs, config)
    with pytest.raises(RuntimeError, match=error):
        as_traced(**inputs)


def test_executorch_sorts_a_symbolic_length_as_a_top_k_of_all():
    model = _NoiseRanks().eval()
    exporter, config = exporters.exporter_for("executorch", dynamic=True)
    exported = exporter.export(model, {"noise": torch.randn(2, 9)}, config)
    assert "_fix_sort_as_topk" in exported.applied
    other = {"noise": torch.randn(3, 7)}  # another length
    (got,) = exported(**other).values()
    torch.testing.assert_close(got, model(**other))


class _LevelOrder(torch.nn.Module):
    """Positions ordered by a small integer level, many of them equal."""

    def forward(self, levels):
        ordered = torch.sort(levels, dim=-1)
        return ordered.values, ordered.indices


@pytest.mark.parametrize("model, inputs", [
    (_RankedQueries(), {"queries": torch.randn(2, 12, 5)}),  # descending, a 0/1 key
    (_LevelOrder(), {"levels": torch.randint(0, 3, (2, 16), dtype=torch.int32)}),  # ascending, values too
])  # fmt: skip
def test_executorch_sorts_equal_integers_in_the_order_they_came(model, inputs):
    exported = _export_module(model.eval(), inputs, "executorch")
    assert "_fix_sort_as_topk" in exported.applied
    for got, expected in zip(exported(**inputs).values(), model(**inputs), strict=True):
        torch.testing.assert_close(got, expected)


class _CroppedUpscale(torch.nn.Module):
    """Swin2SR's upsampler: tokens laid out as an image (channels last), upscaled by a pixel shuffle, cropped."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 12, 3, padding=1)
        self.last = torch.nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, tokens):  # (batch, height, width, channels)
        image = self.last(torch.nn.functional.pixel_shuffle(self.conv(tokens.permute(0, 3, 1, 2)), 2)) + 0.5
        return image[:, :, : tokens.shape[1] * 2 - 1, : tokens.shape[2] * 2]


def test_executorch_crops_a_channels_last_image_at_a_symbolic_size():
    model, traced = _CroppedUpscale().eval(), {"tokens": torch.randn(2, 6, 5, 4)}
    exported = _executorch_dynamic(model, traced)
    assert "_fix_slice_of_channels_last_from_a_contiguous_copy" in exported.applied
    _assert_runs_like_eager(exported, model, {"tokens": torch.randn(3, 7, 6, 4)})
    with disabled_workarounds("_fix_slice_of_channels_last_from_a_contiguous_copy"):
        as_traced = _executorch_dynamic(model, traced)
    with pytest.raises(RuntimeError, match="0x12"):  # the slice's copy refuses two dim orders
        as_traced(**traced)


class _VisibleTokenAttention(torch.nn.Module):
    """VideoMAE pre-training: each sample's visible tokens (as many per sample), picked by the mask, attend to each
    other."""

    def forward(self, tokens, masked):
        visible = tokens[~masked].reshape(tokens.shape[0], -1, tokens.shape[2])
        return visible @ visible.transpose(1, 2)


def _planned_bytes(exported) -> int:
    from exporters.exporter_executorch import execution_plan

    return sum(execution_plan(exported.program).non_const_buffer_sizes)


def test_executorch_plans_a_selection_per_sample_for_the_samples_not_for_the_whole_mask():
    model, masked = _VisibleTokenAttention().eval(), torch.zeros(2, 64, dtype=torch.bool)
    masked[:, ::2] = True
    traced = {"tokens": torch.randn(2, 64, 8), "masked": masked}
    exported = _executorch_dynamic(model, traced)
    assert "_patch_counts_of_selected_elements_at_most_their_number" in exported.applied
    masked = torch.zeros(3, 80, dtype=torch.bool)
    masked[:, :60] = True
    _assert_runs_like_eager(exported, model, {"tokens": torch.randn(3, 80, 8), "masked": masked})
    with disabled_workarounds("_patch_counts_of_selected_elements_at_most_their_number"):
        as_traced = _executorch_dynamic(model, traced)
    # without the tie, a batch of 2 could hold all of the largest mask's tokens: 256 x 256 at a batch of 256
    assert _planned_bytes(as_traced) > 50 * _planned_bytes(exported)


class _KeySample(torch.nn.Module):
    """Informer's ProbSparse attention measures its queries against keys drawn at random."""

    def forward(self, keys):
        return torch.randint(0, keys.shape[1], (400,)), torch.randint(3, size=(2, 5))


def test_executorch_draws_random_integers_from_rand():
    exporter, config = exporters.exporter_for("executorch")
    exported = exporter.export(_KeySample().eval(), {"keys": torch.randn(2, 8)}, config)
    assert "_patch_randint_as_scaled_rand" in exported.applied
    sample, small = exported(keys=torch.randn(2, 8)).values()
    assert sample.dtype == small.dtype == torch.int64 and small.shape == (2, 5)
    assert set(sample.tolist()) == set(range(8))  # every key can be drawn (each misses 400 draws with p < 1e-23)
    assert set(small.tolist()[0] + small.tolist()[1]) <= {0, 1, 2}
    with disabled_workarounds("_patch_randint_as_scaled_rand"), pytest.raises(exporters.ExportError, match="randint"):
        exporter.export(_KeySample().eval(), {"keys": torch.randn(2, 8)}, config)


class _CircularTokenConvolution(torch.nn.Module):
    """Informer embeds its time series by a convolution that pads circularly."""

    def __init__(self):
        super().__init__()
        self.convolution = torch.nn.Conv1d(3, 4, kernel_size=3, padding=1, padding_mode="circular")

    def forward(self, series):
        return self.convolution(series.transpose(1, 2))


def test_executorch_pads_circularly_by_concatenation_and_keeps_the_batch_symbolic():
    model = _CircularTokenConvolution().eval()
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


class _SelectedCounts(torch.nn.Module):
    """GLM-5 Next: how often each key was selected, counted by an int32 index."""

    def forward(self, selected):
        counts = torch.zeros(selected.shape[0], 6, dtype=torch.int32)
        return counts.scatter_add_(-1, selected.to(torch.int32), torch.ones_like(selected, dtype=torch.int32))


def test_executorch_widens_an_int32_scatter_index():
    model, inputs = _SelectedCounts().eval(), {"selected": torch.tensor([[0, 2, 2, 5], [1, 1, 3, 0]])}
    exporter, config = exporters.exporter_for("executorch")
    exported = exporter.export(model, inputs, config)
    assert "_fix_scatter_index_as_int64" in exported.applied
    (got,) = exported(**inputs).values()
    assert torch.equal(got, model(**inputs))
    with disabled_workarounds("_fix_scatter_index_as_int64"), pytest.raises(exporters.ExportError, match="mismatched"):
        exporter.export(model, inputs, config)


def test_executorch_returns_a_slice_that_keeps_everything_as_its_input():
    context = _built_by_the_sweep("Swin2SRForImageSuperResolution")  # crops its image to the size it has
    exported = _export(context, "executorch")
    assert "_fix_alias_as_its_input" in exported.applied
    assert_parity(exported(**context.inputs["A"]), context.expected["A"], TOLERANCE["executorch"])
    with disabled_workarounds("_fix_alias_as_its_input"):
        as_traced = _export(context, "executorch")
    with pytest.raises(RuntimeError, match="0x12"):  # the copy's input and output dim orders differ
        as_traced(**context.inputs["A"])


class _SqueezedProjection(torch.nn.Module):
    """Mistral 3's projector: squeezes a leading axis that, for several images, is not one."""

    def __init__(self):
        super().__init__()
        self.projection = torch.nn.Linear(4, 4)

    def forward(self, tokens):
        return self.projection(tokens).squeeze(0)


class _TransducerJoint(torch.nn.Module):
    """Parakeet's joint network: every audio frame against every label, then a squeeze that leaves labels alone."""

    def forward(self, frames, labels):
        return (frames[:, :, None] + labels[:, None]).squeeze(2)


def test_onnx_squeeze_of_a_symbolic_axis_of_two_or_more_is_left_out():
    model = _TransducerJoint()
    inputs = {"frames": torch.randn(2, 7, 4), "labels": torch.randn(2, 5, 4)}
    exporter, config = exporters.exporter_for("onnx", dynamic=True)
    exported = exporter.export(model, inputs, config)
    assert "_fix_squeeze_of_a_longer_axis" in exported.applied
    other = {"frames": torch.randn(3, 6, 4), "labels": torch.randn(3, 3, 4)}
    (joint,) = exported(**other).values()
    torch.testing.assert_close(torch.as_tensor(joint), model(**other), atol=1e-6, rtol=1e-6)
    with disabled_workarounds("_fix_squeeze_of_a_longer_axis"):
        as_traced = exporter.export(model, inputs, config)
    with pytest.raises(Exception, match="must be 1 instead of 3"):
        as_traced(**other)


def test_onnx_squeeze_of_an_axis_longer_than_one_is_left_out():
    model, inputs = _SqueezedProjection().eval(), {"tokens": torch.randn(8, 4)}
    exporter, config = exporters.exporter_for("onnx")
    exported = exporter.export(model, inputs, config)
    assert "_fix_squeeze_of_a_longer_axis" in exported.applied
    torch.testing.assert_close(exported(**inputs)["output"], model(**inputs), atol=1e-6, rtol=1e-6)
    with disabled_workarounds("_fix_squeeze_of_a_longer_axis"):
        as_traced = exporter.export(model, inputs, config)
    with pytest.raises(Exception, match="must be 1 instead of 8"):
        as_traced(**inputs)


class _PatchEntropy(torch.nn.Module):
    """BLT's patcher: the entropy of each position's next-byte distribution decides where patches start."""

    def forward(self, logits):
        # validating, as by default: dynamo switches the default off for the process once it has compiled anything
        # (the scan operator the recurrence patches use compiles its step), which would let the test pass unpatched
        return torch.distributions.Categorical(logits=logits, validate_args=True).entropy()


class _SpecialTokenSpans(torch.nn.Module):
    """Grounding DINO: each token's previous special token by a running maximum, its next one by a running
    minimum."""

    def forward(self, positions):
        return (*torch.cummax(positions, dim=1), *torch.cummin(positions.flip(1), dim=1))


class _RowsOfSamples(torch.nn.Module):
    """Music Flamingo: the audio sample each encoder row comes from, searching float row starts among integer
    sample ends."""

    def forward(self, sample_lengths, row_starts):
        return torch.searchsorted(sample_lengths.cumsum(0), row_starts, right=True)


class _ShuffledRows(torch.nn.Module):
    """PatchTST's forecast masking shuffles its batch rows; sorted, a permutation is every row once."""

    def forward(self, rows):
        return torch.randperm(rows.shape[0]).sort().values


class _TokenPReLU(torch.nn.Module):
    """DAB-DETR's encoder: a PReLU on 3-D tokens (here one slope per channel, on axis 1)."""

    def __init__(self):
        super().__init__()
        self.activation = torch.nn.PReLU(num_parameters=5, init=0.1)

    def forward(self, tokens):
        return self.activation(tokens)


class _UnbatchedNonMaximumSuppression(torch.nn.Module):
    """SuperPoint's non-maximum suppression: a max pool of its (images, height, width) score maps."""

    def forward(self, scores):
        return torch.nn.functional.max_pool2d(scores, kernel_size=3, stride=1, padding=1) == scores


class _EvalModeDropout(torch.nn.Module):
    """SpeechT5's decoder prenet draws its dropout mask in eval mode too, here with a probability of 0."""

    def forward(self, embeddings):
        return torch.where(torch.bernoulli(embeddings, p=0.0) == 1, embeddings, 0) + embeddings


class _ModalityMasks(torch.nn.Module):
    """Perceiver's multimodal preprocessor: each modality's samples masked with its own probability (0 or 1)."""

    def forward(self, audio, label):
        never = torch.bernoulli(torch.full(audio.shape[:2], 0.0))
        always = torch.bernoulli(torch.full(label.shape[:2], 1.0))
        return audio * (1 - never[..., None]), label * (1 - always[..., None])


def test_onnx_draws_bernoulli_ones_with_their_probability():
    model, inputs = _ModalityMasks(), {"audio": torch.randn(2, 6, 3), "label": torch.randn(2, 1, 3)}
    exported = _export_module(model, inputs, "onnx", dynamic=True)
    assert "_aten_bernoulli" in exported.applied
    other = {"audio": torch.randn(3, 4, 3), "label": torch.randn(3, 1, 3)}
    for got, expected in zip(exported(**other).values(), model(**other), strict=True):
        torch.testing.assert_close(got, expected)
    with disabled_workarounds("_aten_bernoulli"):
        as_runtime_draws = _export_module(model, inputs, "onnx", dynamic=True)
    audio, label = as_runtime_draws(**other).values()
    assert not audio.any() and torch.equal(label, other["label"]), "ONNX Runtime's Bernoulli draws the complement"


MODULE_CASES = [  # (backend, module, inputs, workaround, error without it)
    ("executorch", _PatchPositions, {"coordinates": torch.tensor([[-1.0, 0.0, 0.1, 0.25, 0.3, 0.75, 0.9, 1.0]])},
     "_patch_bucketize_as_comparison", "bucketize.Tensor is not in Core ATen"),
    ("onnx", _CheckedTokens, {"input_ids": torch.tensor([[3, 1, 4], [1, 5, 9]])},
     "_aten__is_all_true", "No ONNX function found for .*_is_all_true"),
    ("executorch", _CheckedTokens, {"input_ids": torch.tensor([[3, 1, 4], [1, 5, 9]])},
     "_fix_tensor_condition_assert", "_is_all_true.default is not in Core ATen"),
    ("executorch", _SameEosCount, {"input_ids": torch.tensor([[3, 1, 4], [1, 5, 9]])},
     "_fix_size_only_check", "unique_consecutive.default is not in Core ATen"),
    ("onnx", _InvertedMask, {"attention_mask": torch.tensor([[1, 1, 0], [1, 0, 0]])},
     "_fix_number_minus_tensor", "compatible OpOverload for aten.sub"),
    ("executorch", _AttentionSinkMax, {"scores": torch.randn(2, 4, 7, 8)},
     "_fix_max_for_xnnpack", "amax.default only supports dim == 2 or dim == 3"),
    ("executorch", _StridePool, {"tokens": torch.randn(2, 16, 8)},
     "_fix_max_for_xnnpack", "amax.default only supports"),
    ("executorch", _TransposedAndItsCopy, {"x": torch.randn(2, 3, 4)},
     "_patch_xnnpack_copies_of_shared_values", "is already in the inputs"),
    ("onnx", _PatchIndexPerImage, {"patches": torch.randn(5, 3), "patches_per_image": torch.tensor([2, 3])},
     "_aten_sym_numel", "No ONNX function found for .*sym_numel"),
    ("executorch", _PatchIndexPerImage, {"patches": torch.randn(5, 3), "patches_per_image": torch.tensor([2, 3])},
     "_patch_repeat_interleave_as_gather", "repeat_interleave.Tensor is not in Core ATen"),
    ("dynamo", _PatchEntropy, {"logits": torch.randn(2, 5, 8)}, "_patch_categorical_unvalidated", "data-dependent"),
    ("onnx", _SpecialTokenSpans, {"positions": torch.tensor([[-1, 2, -1, -1, 4, 4, -1], [0, -1, 3, 1, -1, 3, 6]])},
     "_patch_running_extremes_by_comparison", "No ONNX function found for .*cumm"),
    ("onnx", _RowsOfSamples,
     {"sample_lengths": torch.tensor([3, 1, 4]), "row_starts": torch.tensor([0.0, 3, 3.5, 4, 7])},
     "_aten_searchsorted", "No ONNX function found for .*searchsorted"),
    ("executorch", _RowsOfSamples,
     {"sample_lengths": torch.tensor([3, 1, 4]), "row_starts": torch.tensor([0.0, 3, 3.5, 4, 7])},
     "_patch_searchsorted_as_comparison", "searchsorted.Tensor is not in Core ATen"),
    ("onnx", _ShuffledRows, {"rows": torch.randn(5, 3)}, "_aten_randperm", "No ONNX function found for .*randperm"),
    ("executorch", _TokenPReLU, {"tokens": torch.randn(2, 5, 8)},
     "_fix_prelu_for_xnnpack", "ChannelsLastTaggedReshapePass"),
    ("executorch", _UnbatchedNonMaximumSuppression, {"scores": torch.randn(2, 8, 8)},
     "_fix_unbatched_pool_for_xnnpack", "ChannelsLastTaggedReshapePass"),
    ("executorch", _EvalModeDropout, {"embeddings": torch.randn(2, 3, 4)},
     "_fix_certain_bernoulli", "bernoulli.p is not in Core ATen"),
    ("executorch", _PickedColumns, {"x": torch.randn(2, 5, 8), "keep": torch.tensor([True, False, True, True, False])},
     "_patch_dim_order_of_contiguous_strides", r"data-dependent expression 8\*u\d+ < 8"),
    ("executorch", _MaskedTail, {"tokens": torch.randn(2, 6, 3), "masked": torch.tensor([False, True, True, False])},
     "_fix_tail_slice_of_a_count_from_the_front", r"data-dependent expression -u\d+ < 0"),
    ("executorch", _SilencedNoise, {"means": torch.randn(2, 3, 5), "log_variances": torch.randn(2, 3, 5)},
     "_fix_noise_scaled_by_zero", r"randn(_like)?\.default is not in Core ATen"),
    ("executorch", _ScoreAtFirstBest, {"scores": torch.randn(2, 7)},
     "_fix_counts_read_from_data_bounded", r"data-dependent expression 2 <= -u\d+ - 1"),
]  # fmt: skip


class _MainAndPredictedStreams(torch.nn.Module):
    """ProphetNet's decoder cuts its hidden states into the main and the predicting streams, halves of a length."""

    def forward(self, hidden):
        main, predicted = hidden.chunk(2, dim=1)
        return main * 2 + predicted


def test_a_split_by_a_symbolic_size_is_left_to_onnx_runtime():
    model, hidden = _MainAndPredictedStreams(), torch.randn(2, 8, 4)
    exporter, config = exporters.exporter_for("onnx", dynamic=True)
    exported = exporter.export(model, {"hidden": hidden}, config)
    assert "_patch_split_by_a_symbolic_size_left_unfolded" in exported.applied
    other = torch.randn(3, 12, 4)
    (streams,) = exported(hidden=other).values()
    torch.testing.assert_close(torch.as_tensor(streams), model(other), atol=1e-6, rtol=1e-6)
    with disabled_workarounds("_patch_split_by_a_symbolic_size_left_unfolded"):
        with pytest.raises(exporters.ExportError, match="optimize"):
            exporter.export(model, {"hidden": hidden}, config)


class _TanhGelu(torch.nn.Module):
    """Gemma's and SigLIP's MLPs: `gelu_pytorch_tanh`."""

    def forward(self, x):
        return torch.nn.functional.gelu(x, approximate="tanh")


def test_executorch_computes_the_tanh_gelu_asked_for():
    model, x = _TanhGelu(), torch.linspace(-4, 4, 81).view(1, 81)  # the forms differ most near -2.7: 4.7e-4
    exporter, config = exporters.exporter_for("executorch")
    exported = exporter.export(model, {"x": x}, config)
    assert "_patch_xnnpack_exact_gelu_only" in exported.applied
    (tanh_form,) = exported(x=x).values()
    torch.testing.assert_close(tanh_form, model(x), atol=1e-6, rtol=1e-6)
    with disabled_workarounds("_patch_xnnpack_exact_gelu_only"):
        (delegated,) = exporter.export(model, {"x": x}, config)(x=x).values()
    assert (delegated - model(x)).abs().max() > 4e-4
    torch.testing.assert_close(delegated, torch.nn.functional.gelu(x), atol=1e-6, rtol=1e-6)  # the exact form


def _crossed_chains():
    """Two chains, each a delegated node, a portable one and a delegated one; partitions that each take the start
    of one chain and the end of the other are each convex, and feed one another in a ring."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    first_start = graph.call_function(torch.relu, (x,))
    first_end = graph.call_function(torch.relu, (graph.call_function(torch.neg, (first_start,)),))
    second_start = graph.call_function(torch.sigmoid, (x,))
    second_end = graph.call_function(torch.sigmoid, (graph.call_function(torch.neg, (second_start,)),))
    graph.output((first_end, second_end))
    return torch.fx.GraphModule(torch.nn.Module(), graph), [[first_start, second_end], [second_start, first_end]]


def test_executorch_splits_partitions_that_feed_one_another():
    from torch.fx.passes.infra.partitioner import Partition
    from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

    from exporters.exporter_executorch import _patch_partitions_out_of_rings

    x = torch.randn(3, 4)
    module, ringed = _crossed_chains()
    with pytest.raises(AssertionError, match="dependency cycles"):
        fuse_by_partitions(module, [dict.fromkeys(nodes) for nodes in ringed])
    module, ringed = _crossed_chains()
    expected = module(x)
    proposed = [Partition(id=number, nodes=nodes) for number, nodes in enumerate(ringed)]
    partitions = _patch_partitions_out_of_rings(lambda partitioner: proposed)(None)
    assert sorted(len(partition.nodes) for partition in partitions) == [1, 1, 2]  # one split where its chain returns
    fused = fuse_by_partitions(module, [partition.nodes for partition in partitions])
    for got, want in zip(fused(x), expected, strict=True):
        assert torch.equal(got, want)


class _BucketsModuloLength(torch.nn.Module):
    """Reformer's LSH attention takes its sorted positions modulo the (padded) sequence length."""

    def forward(self, positions):
        return positions % positions.shape[1]


def test_a_remainder_by_a_symbolic_size_runs_in_onnx_runtime():
    model, positions = _BucketsModuloLength(), torch.arange(-6, 8).view(2, 7)
    exporter, config = exporters.exporter_for("onnx", dynamic=True)
    exported = exporter.export(model, {"positions": positions}, config)
    assert "_fix_remainder_by_a_symbolic_size" in exported.applied
    other = torch.arange(-9, 6).view(3, 5)  # Python's sign: the divisor's
    (remainders,) = exported(positions=other).values()
    assert torch.equal(torch.as_tensor(remainders), model(other))
    with disabled_workarounds("_fix_remainder_by_a_symbolic_size"), pytest.raises(exporters.ExportError, match="int()"):
        exporter.export(model, {"positions": positions}, config)


@pytest.mark.parametrize("backend, module, inputs, workaround, error", MODULE_CASES, ids=[c[3] for c in MODULE_CASES])
def test_a_traced_pattern_exports_with_its_workaround_and_fails_without(backend, module, inputs, workaround, error):
    model = module().eval()
    exporter, config = exporters.exporter_for(backend)
    exported = exporter.export(model, inputs, config)
    assert workaround in exported.applied
    expected = model(**inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for got, want in zip(exported(**inputs).values(), expected, strict=True):
        assert torch.equal(got, want)
    with disabled_workarounds(workaround), pytest.raises(exporters.ExportError, match=error):
        exporter.export(model, inputs, config)


def test_executorch_repeats_by_counts_of_a_symbolic_number_of_images():
    model = _PatchIndexPerImage().eval()
    exporter, config = exporters.exporter_for("executorch", dynamic=True)
    exported = exporter.export(model, {"patches": torch.randn(5, 3), "patches_per_image": torch.tensor([2, 3])}, config)
    assert "_patch_repeat_interleave_as_gather" in exported.applied
    other = {"patches": torch.randn(6, 3), "patches_per_image": torch.tensor([1, 2, 3])}  # one image more
    (got,) = exported(**other).values()
    torch.testing.assert_close(got, model(**other))


class _PositiveEntries(torch.nn.Module):
    """A mask's true places, the way vision towers pick their real patches: `nonzero` of a vector, its column
    taken with `squeeze`, and the same through `torch.where(mask)` (whose tuple `to_edge` decomposes)."""

    def forward(self, scores):
        flat = scores.flatten()
        index = (flat > 0).nonzero().squeeze(1)
        where = torch.where(flat < 0)[0]
        torch._check(index.shape[0] > 1)
        torch._check(where.shape[0] > 1)
        return flat[index] * 2, flat[where]


def test_executorch_runs_kernels_on_the_nonzero_of_a_vector():
    model = _PositiveEntries().eval()
    scores = torch.tensor([[1.0, -1.0, 2.0], [3.0, -2.0, 1.0]])
    other = torch.tensor([[1.0, -1.0, 2.0, 5.0], [3.0, -2.0, 1.0, -4.0], [1.0, 1.0, 1.0, 1.0]])
    exporter, config = exporters.exporter_for("executorch", dynamic=True)
    exported = exporter.export(model, {"scores": scores}, config)
    assert "_patch_contiguous_order_below_four_axes" in exported.applied
    for got, want in zip(exported(scores=other).values(), model(other), strict=True):
        assert torch.equal(got, want)
    with disabled_workarounds("_patch_contiguous_order_below_four_axes"):
        exported = exporter.export(model, {"scores": scores}, config)
        with pytest.raises(RuntimeError, match="0x12"):  # a portable kernel refuses the dim orders
            exported(scores=other)


class _KeypointsAboveThreshold(torch.nn.Module):
    """SuperPoint's keypoints: where the scores pass a threshold, as (x, y), and the scores there."""

    def forward(self, scores):
        places = (scores > 0.5).nonzero()
        return places.flip(1).float(), scores[places[:, 0], places[:, 1]]


@pytest.mark.parametrize("dynamic", [False, True])
def test_executorch_lays_out_the_nonzero_of_a_matrix_by_rows(dynamic):
    torch.manual_seed(0)
    model, scores, other = _KeypointsAboveThreshold().eval(), torch.rand(6, 5), torch.rand(6, 5)
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


class _SpaceToDepth(torch.nn.Module):
    """Perceiver's video patches: frames folded into blocks of 2 x 2 x 2 through an 8-axis view and permute."""

    def __init__(self):
        super().__init__()
        self.projection = torch.nn.Linear(24, 8)

    def forward(self, frames):
        batch, time, channels, height, width = frames.shape
        blocks = frames.view(batch, time // 2, 2, channels, height // 2, 2, width // 2, 2)
        blocks = blocks.permute(0, 1, 4, 6, 2, 5, 7, 3).reshape(batch, time // 2, height // 2, width // 2, -1)
        return self.projection(blocks * 2)


def test_xnnpack_leaves_tensors_of_more_than_six_axes_to_portable_kernels():
    model, frames = _SpaceToDepth().eval(), torch.randn(1, 2, 3, 4, 4)
    exporter, config = exporters.exporter_for("executorch")
    exported = exporter.export(model, {"frames": frames}, config)
    assert "_patch_xnnpack_rank_limit" in exported.applied
    (got,) = exported(frames=frames).values()
    torch.testing.assert_close(got, model(frames), atol=TOLERANCE["executorch"], rtol=TOLERANCE["executorch"])
    with disabled_workarounds("_patch_xnnpack_rank_limit"):
        exported = exporter.export(model, {"frames": frames}, config)
        with pytest.raises(RuntimeError, match="0x:1"):  # XNNPACK cannot define the 8-axis tensor
            exported(frames=frames)


class _EmptyKeysConcatenated(torch.nn.Module):
    """A key cache of zero width (MistralLarge 4's rope-less part) concatenated with the step's empty keys."""

    def forward(self, states):
        empty = states[..., :0]
        keys = torch.cat([empty, empty * 2], dim=-1)
        return states * 2, keys


def test_executorch_keeps_a_cat_of_empty_tensors_of_a_symbolic_shape():
    model, states = _EmptyKeysConcatenated().eval(), torch.randn(2, 5, 4)
    exporter, config = exporters.exporter_for("executorch", dynamic=True)
    exported = exporter.export(model, {"states": states}, config)
    assert "_patch_empty_cat_left_whole" in exported.applied
    other = torch.randn(3, 7, 4)
    for got, want in zip(exported(states=other).values(), model(other), strict=True):
        assert got.shape == want.shape and torch.equal(got, want)
    with disabled_workarounds("_patch_empty_cat_left_whole"), pytest.raises(exporters.ExportError, match="int list"):
        exporter.export(model, {"states": states}, config)


class _WindowOrdered(torch.nn.Module):
    """MiniCPM-V's window merger: patches put in window order by the index its image sizes give, then read image by
    image."""

    def forward(self, hidden_states, target_sizes):
        from transformers.models.minicpmv4_7 import modeling_minicpmv4_7 as minicpm

        grid = torch.nn.functional.pad(target_sizes, (1, 0), value=1)
        window_index, _ = minicpm.get_vision_window_index(grid, 1, 2, 1)
        ordered = hidden_states[:, window_index] * 2
        first = int(target_sizes[0].prod())
        return ordered[:, :first], ordered[:, first:]


def test_a_static_export_computes_the_window_order_of_its_baked_image_sizes():
    model = _WindowOrdered().eval()
    inputs = {"hidden_states": torch.randn(1, 24, 4), "target_sizes": torch.tensor([[4, 4], [2, 4]])}
    exporter, config = exporters.exporter_for("executorch")
    exported = exporter.export(model, inputs, config)
    assert "_patch_whole_windows_at_once" in exported.applied
    for got, want in zip(exported(**inputs).values(), model(**inputs), strict=True):
        assert torch.equal(got, want)
    with disabled_workarounds("_patch_whole_windows_at_once"), pytest.raises(exporters.ExportError, match="data-dep"):
        exporter.export(model, inputs, config)  # traced, the order's boolean indexing leaves lengths unknown


class _EmptyCacheExtended(torch.nn.Module):
    """A value cache that starts as a 1-D tensor of no elements, extended by a step's values of zero width
    (MistralLarge 4's layers without rope)."""

    def forward(self, states):
        values = states[..., :0].unsqueeze(1)
        return states * 2, torch.cat([torch.tensor([]), values], dim=-2)


def test_executorch_keeps_the_length_of_a_concatenation_of_empty_tensors():
    model, states = _EmptyCacheExtended().eval(), torch.randn(2, 5, 4)
    exporter, config = exporters.exporter_for("executorch", dynamic=True)
    exported = exporter.export(model, {"states": states}, config)
    assert "_fix_empty_cat_as_its_tensor" in exported.applied
    other = torch.randn(3, 7, 4)
    got = list(exported(states=other).values())
    assert [tuple(tensor.shape) for tensor in got] == [(3, 7, 4), (3, 1, 7, 0)]
    with disabled_workarounds("_fix_empty_cat_as_its_tensor"):
        exported = exporter.export(model, {"states": states}, config)
        assert tuple(list(exported(states=other).values())[1].shape) == (3, 1, 0, 0)  # the runtime's length


class _KeypointPlaces(torch.nn.Module):
    """EfficientLoFTR's coarse keypoints: a matched index (-1 when unmatched) split into column and row, by a
    width that is a tensor, a constant, a negative divisor and a size (symbolic when exported dynamic)."""

    def forward(self, matched):
        width = torch.tensor(4)
        return torch.stack([matched % width, matched // width, matched % 4, matched % -3, matched % (width - 7),
                            matched % (matched.shape[-1] // 2)])


@pytest.mark.parametrize("dynamic", [False, True])
def test_executorch_integer_remainder_takes_the_sign_of_the_divisor(dynamic):
    model, matched = _KeypointPlaces().eval(), torch.tensor([[-1, 3, 5, -6, 0, -8]])
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


class _PaddedToBlocks(torch.nn.Module):
    """LongT5's local attention: tokens padded to whole blocks of 4 by `-length % 4`, then summed block by block."""

    def forward(self, tokens):
        padded = torch.nn.functional.pad(tokens, (0, 0, 0, -tokens.shape[1] % 4))
        return padded.view(tokens.shape[0], -1, 4, tokens.shape[2]).sum(2)


def test_executorch_remainder_of_sizes_takes_the_sign_of_the_divisor():
    model = _PaddedToBlocks().eval()
    exported = _executorch_dynamic(model, {"tokens": torch.randn(2, 7, 3)})
    assert "_fix_integer_remainder_sign" in exported.applied
    for length in (7, 5, 8):
        _assert_runs_like_eager(exported, model, {"tokens": torch.randn(3, length, 3)})
    with disabled_workarounds("_fix_integer_remainder_sign"):
        as_lowered = _executorch_dynamic(model, {"tokens": torch.randn(2, 7, 3)})
    with pytest.raises(RuntimeError, match="0x12"):  # padded by -3, a block short: the view refuses its size
        as_lowered(tokens=torch.randn(2, 7, 3))


class _EntropyPatchStarts(torch.nn.Module):
    """BLT's patcher: the positions of the peaks of each row first (then the other positions), cut at the largest
    count of peaks, a number read from the data and compared with the width of a dynamic axis."""

    def forward(self, scores):
        peaks = scores > 0
        width = peaks.shape[1]
        positions = torch.arange(width).expand(scores.shape[0], -1)
        starts = torch.cat([positions, torch.full_like(positions, width)], 1)[torch.cat([peaks, ~peaks], 1)]
        return starts.reshape(scores.shape[0], width)[:, : peaks.sum(1).max()]


def test_executorch_counts_read_from_data_stay_within_a_dynamic_width():
    model, generator = _EntropyPatchStarts().eval(), torch.Generator().manual_seed(0)
    exported = _executorch_dynamic(model, {"scores": torch.randn(2, 7, generator=generator)})
    assert "_fix_counts_read_from_data_bounded" in exported.applied
    for shape in ((2, 7), (3, 5), (2, 9)):
        scores = torch.randn(*shape, generator=generator)
        (got,) = exported(scores=scores).values()
        assert torch.equal(got, model(scores)) and got.shape[1] < shape[1]
    with disabled_workarounds("_fix_counts_read_from_data_bounded"):
        with pytest.raises(exporters.ExportError, match=r"data-dependent expression u\d+"):
            _executorch_dynamic(model, {"scores": torch.randn(2, 7, generator=generator)})


class _RelativeShift(torch.nn.Module):
    """XLNet's relative shift: scores against twice as many relative positions, shifted by one through a reshape,
    whose sizes interval arithmetic bounds far above their largest values."""

    def forward(self, scores):
        batch, length = scores.shape
        table = scores[:, :, None] * torch.arange(2 * length, dtype=scores.dtype)
        shifted = table.reshape(batch, 2 * length, length)[:, 1:].reshape(batch, length, 2 * length - 1)
        return torch.index_select(shifted, 2, torch.arange(length))


def test_executorch_plans_memory_for_the_largest_value_of_each_size():
    model = _RelativeShift().eval()
    exporter, config = exporters.exporter_for("executorch", dynamic=True)
    exported = exporter.export(model, {"scores": torch.randn(2, 5)}, config)
    assert "_patch_sizes_bounded_exactly" in exported.applied
    other = torch.randn(3, 9)
    (got,) = exported(scores=other).values()
    assert torch.equal(got, model(other))
    with disabled_workarounds("_patch_sizes_bounded_exactly"):
        exported = exporter.export(model, {"scores": torch.randn(2, 5)}, config)
        with pytest.raises(RuntimeError, match="0x:21"):  # the runtime cannot place the tensors planned so
            exported(scores=other)


def test_a_size_interval_arithmetic_cannot_bound_is_planned_for_its_largest_value_not_its_traced_one():
    # Swin2SR's window reverse divides a padded height by its window count, a floor interval arithmetic lets reach 0:
    # ExecuTorch planned the traced batch's size, and a batch of 3 ran out of room ("Attempted to resize")
    from executorch.exir import sym_util
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    shape_env = ShapeEnv()

    def input_size(name, traced, largest):
        symbol = shape_env.create_symbol(traced, ConstantSource(name), dynamic_dim=DimDynamic.DYNAMIC)
        shape_env.constrain_symbol_range(symbol, compiler_min=2, compiler_max=largest)
        return shape_env.create_symintnode(symbol, hint=traced)

    batch, height = input_size("batch", 2, 32), input_size("height", 16, 64)
    padded = height + (8 - height % 8) % 8
    rows = batch * (padded // (padded // 8))  # always batch * 8
    assert sym_util.eval_upper_bound(rows) == 2 * 8
    with apply_patches("executorch", select=lambda path: path == "executorch.exir.sym_util.eval_upper_bound"):
        assert sym_util.eval_upper_bound(rows) == 32 * 8


def test_a_count_bounded_only_by_int64_is_planned_within_the_data_dependent_ceiling():
    # RADIO's count of kept tokens came bounded by int64's top: the exact search's range was too long to build, and
    # interval arithmetic's bound made memory offsets past 64 bits
    import sys

    from executorch.exir import sym_util
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from exporters.exporter_executorch import _DATA_DEPENDENT_CEILING

    shape_env = ShapeEnv()
    count = shape_env.create_unbacked_symint()
    shape_env.constrain_symbol_range(count.node.expr, compiler_min=0, compiler_max=sys.maxsize - 1)
    size = count * 4
    assert sym_util.eval_upper_bound(size) > 2**64
    with apply_patches("executorch", select=lambda path: path == "executorch.exir.sym_util.eval_upper_bound"):
        assert sym_util.eval_upper_bound(size) == 4 * _DATA_DEPENDENT_CEILING


class _GuardedProjection(torch.nn.Module):
    """A branch on the sequence length (a guard on a symbolic size) around a linear layer XNNPACK takes."""

    def __init__(self):
        super().__init__()
        self.projection = torch.nn.Linear(4, 4)

    def forward(self, tokens):
        if tokens.shape[1] > 2:
            tokens = tokens * 2
        return self.projection(tokens)


def test_executorch_lowers_without_printing_the_guards_of_each_partition():
    model = _GuardedProjection().eval()
    exporter, config = exporters.exporter_for("executorch", dynamic=True)
    exported = exporter.export(model, {"tokens": torch.randn(2, 5, 4)}, config)
    assert "_patch_guards_left_unprinted" in exported.applied, "a guarded dynamic program has guards to leave out"
    other = torch.randn(3, 7, 4)
    (got,) = exported(tokens=other).values()
    torch.testing.assert_close(got, model(other), atol=1e-5, rtol=1e-5)


def test_executorch_node_histories_are_shared_not_copied():
    from torch.fx.traceback import NodeSource

    from exporters.exporter_executorch import _patch_node_history_shared  # registers it

    graph = torch.fx.Graph()
    node = graph.placeholder("tokens")
    node.meta["from_node"] = [NodeSource(None, "an earlier pass")]
    with apply_patches("executorch", select=lambda path: path.endswith("NodeSource.__init__")):
        assert NodeSource.__init__.__qualname__.startswith(_patch_node_history_shared.__name__)
        source = NodeSource(node, "a later pass")
    assert source.from_node[0] is node.meta["from_node"][0], "the recorded history is shared"
    assert source.from_node is not node.meta["from_node"], "the node's own list stays its own"
    model = _GuardedProjection().eval()
    exporter, config = exporters.exporter_for("executorch")
    exported = exporter.export(model, {"tokens": torch.randn(2, 5, 4)}, config)
    assert "_patch_node_history_shared" in exported.applied
    tokens = torch.randn(2, 5, 4)
    (got,) = exported(tokens=tokens).values()
    torch.testing.assert_close(got, model(tokens), atol=1e-5, rtol=1e-5)


def test_paddleocr_projector_blocks_gathered_are_eagers_image_by_image():
    from exporters.exporter_dynamo import _patch_paddleocr_projector_blocks_gathered

    projector = _built_by_the_sweep("PaddleOCRVLModel").model.projector
    grids = torch.tensor([[1, 4, 6], [2, 2, 4], [1, 6, 2]])  # images, and a video of 2 frames
    features = torch.randn(int(grids.prod(-1).sum()), projector.pre_norm.normalized_shape[0])
    gathered = _patch_paddleocr_projector_blocks_gathered(type(projector).forward)
    with torch.no_grad():
        torch.testing.assert_close(gathered(projector, features, grids), projector(features, grids))
    fixed = _fixed_axes_with_and_without("PaddleOCRVLModel", ["_patch_paddleocr_projector_blocks_gathered"])
    assert "image_grid_thw axis 0 = 2 (second set: 3)" in fixed["_patch_paddleocr_projector_blocks_gathered"]


def test_lfm3_vl_convolution_by_neighbours_is_eagers_frame_by_frame():
    from transformers.models.lfm3_vl.modeling_lfm3_vl import Lfm3VlVisionShortConv

    from exporters.exporter_dynamo import _patch_lfm3_vl_convolution_by_neighbours, _WholeSplit

    model = _built_by_the_sweep("Lfm3VlModel").model
    conv = next(module for module in model.modules() if isinstance(module, Lfm3VlVisionShortConv))
    merge = conv.spatial_merge_size
    grids = torch.tensor([[1, 2, 3], [2, 3, 1], [1, 1, 2]]) * torch.tensor([1, merge, merge])  # a video of 2 frames
    hidden = torch.randn(int(grids.prod(-1).sum()), conv.in_proj.in_features)
    by_neighbours = _patch_lfm3_vl_convolution_by_neighbours(type(conv).forward)
    with torch.no_grad():
        torch.testing.assert_close(by_neighbours(conv, hidden, _WholeSplit(grids)), conv(hidden, grids.tolist()))
    _, _, export = _exported_on_the_varying_axes("Lfm3VlVisionModel", ["_patch_lfm3_vl_convolution_by_neighbours"])
    with disabled_workarounds("_patch_lfm3_vl_convolution_by_neighbours"), pytest.raises(Exception, match="symbolic"):
        export()  # the grid the tower hands its layers stays a symbolic count, which the loop cannot iterate


@pytest.mark.parametrize("name", ["DeepseekOcr2Model", "UnlimitedOcrModel", "Step3p7Model"])
def test_global_views_laid_out_at_once_are_eagers_image_by_image(name):
    from exporters.exporter_dynamo import _global_views_at_once

    context = _built_by_the_sweep(name)
    pixel_values = context.inputs["B"]["pixel_values"]  # three images
    with torch.no_grad():
        by_image = context.model.get_image_features(pixel_values).pooler_output
        at_once = _global_views_at_once(context.model, pixel_values).pooler_output
    assert len(by_image) == 3 and len(at_once) == 1
    torch.testing.assert_close(at_once[0], torch.cat(by_image))


def test_global_views_at_once_keep_the_image_count_symbolic():
    fixed = _fixed_axes_with_and_without("DeepseekOcr2Model", ["_patch_global_views_laid_out_at_once"])
    assert "pixel_values axis 0 = 2 (second set: 3)" in fixed["_patch_global_views_laid_out_at_once"]


def test_step3p7_tower_lays_out_its_positions_from_its_grid_not_from_data():
    """Written into a tensor and read back, the tower's grid sizes were data-dependent: ExecuTorch found no bound to
    plan its positions for."""

    def read_from_data(exported):
        return [symbol for symbol in exported.program.range_constraints if str(symbol).startswith("u")]

    _, exported, export = _exported_on_the_varying_axes("Step3p7VisionModel", ["_patch_step3p7_positions_from_the_grid"])
    assert read_from_data(exported) == []
    with disabled_workarounds("_patch_step3p7_positions_from_the_grid"):
        assert read_from_data(export())


# several resolutions to pick from, and images that pick each: wide and tall ones lose rows or columns unpadded
ANYRES_PINPOINTS = [[32, 32], [32, 64], [64, 32], [64, 64], [64, 128], [128, 64]]
ANYRES_SIZES = torch.tensor([[10, 60], [60, 10], [32, 32], [50, 45], [64, 40], [10, 120], [120, 10]])


def _anyres_features(output):
    """Every image's features end to end: LLaVA-NeXT's per-image list, or each of Granite 4 Vision's layers'."""
    if hasattr(output, "deepstack_features"):
        return [torch.cat(parts) for _, parts in output.deepstack_features]
    return [torch.cat(output.pooler_output)]


@pytest.mark.parametrize("name", ["LlavaNextModel", "LlavaOnevisionModel", "Granite4VisionModel"])
def test_anyres_images_packed_at_once_are_eagers_image_by_image(name):
    from exporters.utils import apply_patches

    model = _built_by_the_sweep(name).model
    model.config.image_grid_pinpoints = ANYRES_PINPOINTS
    tile = model.config.vision_config.image_size
    pixel_values = torch.randn(len(ANYRES_SIZES), 9, 3, tile, tile)  # up to 8 tiles and the overview
    module = type(model).__module__
    with torch.no_grad():
        by_image = _anyres_features(model.get_image_features(pixel_values, ANYRES_SIZES))
        with apply_patches("dynamo", select=lambda path: path.startswith(module + ".")):
            at_once = _anyres_features(model.get_image_features(pixel_values, ANYRES_SIZES))
    assert len(at_once) == len(by_image)
    for ours, eagers in zip(at_once, by_image):
        torch.testing.assert_close(ours, eagers)


def test_anyres_images_keep_their_count_and_sizes_symbolic():
    """Exported on two images, run on five of other sizes that pick other grids; without the patch the trace
    stops on the sizes' values."""
    context = _built_by_the_sweep("LlavaNextModel")
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


def test_superpoint_keypoints_at_once_are_eagers_image_by_image():
    """Every image's keypoints, scores and descriptors at once, as eager pads them: all of each image's keypoints,
    or the best `max_keypoints` where some images have more; and the batch stays symbolic."""
    from exporters.exporter_dynamo import _superpoint_keypoints_at_once

    model = _built_by_the_sweep("SuperPointForKeypointDetection").model
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
    fixed = _fixed_axes_with_and_without("SuperPointForKeypointDetection",
                                         ["_patch_superpoint_keypoints_of_every_image_at_once"])
    assert "pixel_values axis 0 = 2 (second set: 3)" in fixed["_patch_superpoint_keypoints_of_every_image_at_once"]


def test_cosmos3_edge_positions_resized_at_once_are_eagers_frame_by_frame():
    from transformers.models.cosmos3_edge.modeling_cosmos3_edge import Cosmos3EdgeVisionEmbeddings

    from exporters.exporter_dynamo import _patch_cosmos3_edge_positions_resized_at_once

    original = Cosmos3EdgeVisionEmbeddings.resize_positional_embeddings
    at_once = _patch_cosmos3_edge_positions_resized_at_once(original)
    table = torch.randn(6, 6, 8, generator=torch.Generator().manual_seed(0))
    grids = torch.tensor([[1, 4, 6], [2, 2, 2], [1, 8, 4], [3, 6, 10]])  # shrunk and grown, videos of 2 and 3 frames
    for merge in (1, 2):
        torch.testing.assert_close(at_once(table, grids, merge), original(table, grids, merge))
    workaround = "_patch_cosmos3_edge_positions_resized_at_once"
    _, _, export = _exported_on_the_varying_axes("Cosmos3EdgeVisionModel", [workaround])
    with disabled_workarounds(workaround), pytest.raises(
            exporters.ExportError, match="data-dependent"):
        export()


def test_minicpm_positions_windows_and_merger_at_once_are_eagers_image_by_image():
    from transformers.models.minicpmv4_6 import modeling_minicpmv4_6 as minicpm

    from exporters.exporter_dynamo import (
        _patch_minicpm_merger_blocks_gathered,
        _patch_nearest_positions_at_once,
        _patch_whole_windows_at_once,
    )

    sizes = torch.tensor([[8, 12], [4, 4], [12, 8]])  # whole windows and merge blocks, two rounds deep
    positions = _patch_nearest_positions_at_once(minicpm.get_vision_nearest_position_ids)
    torch.testing.assert_close(positions(sizes, 5), minicpm.get_vision_nearest_position_ids(sizes, 5))
    grid = torch.nn.functional.pad(sizes, (1, 0), value=1)
    windows = _patch_whole_windows_at_once(minicpm.get_vision_window_index)
    for ours, eagers in zip(windows(grid, 1, 2, 1), minicpm.get_vision_window_index(grid, 1, 2, 1)):
        torch.testing.assert_close(ours, eagers, check_dtype=False)
    config = _built_by_the_sweep("MiniCPMV4_6ForConditionalGeneration").model.config
    config.merger_times = 2  # the tiny model folds once
    merger = minicpm.MiniCPMV4_6Merger(config).eval()
    features = torch.randn(1, int(sizes.prod(-1).sum()), merger.mlp[0].pre_norm.normalized_shape[0] // 4)
    with torch.no_grad():
        (gathered,) = _patch_minicpm_merger_blocks_gathered(type(merger).forward)(merger, features, sizes)
        torch.testing.assert_close(gathered, torch.cat(merger(features, sizes)))


def test_emu3_image_tokens_cropped_at_once_are_eagers_image_by_image():
    from transformers.models.emu3.modeling_emu3 import Emu3Model

    from exporters.exporter_dynamo import _patch_emu3_image_tokens_cropped_at_once

    model = _built_by_the_sweep("Emu3Model").model
    side = 32
    factor = model.vqmodel.vision_spatial_factor
    # whole, rows cropped, columns cropped, both
    sizes = torch.tensor([[side, side], [side // 2, side], [side, side - factor], [factor, factor]])
    pixel_values = torch.randn(len(sizes), 3, side, side, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        by_image = Emu3Model.get_image_features(model, pixel_values, sizes).pooler_output
        at_once = _patch_emu3_image_tokens_cropped_at_once(Emu3Model.get_image_features)(model, pixel_values, sizes)
    torch.testing.assert_close(at_once.pooler_output[0], torch.cat(by_image))


def test_ernie_vl_frame_pairs_at_once_are_eagers_image_by_image():
    from transformers.models.ernie4_5_vl_moe.modeling_ernie4_5_vl_moe import (
        Ernie4_5_VLMoeVariableResolutionResamplerModel as Resampler,
    )

    from exporters.exporter_dynamo import _patch_ernie_vl_frame_pairs_at_once

    resampler = types.SimpleNamespace(spatial_merge_size=2)
    grids = torch.tensor([[1, 4, 6], [2, 2, 2], [3, 4, 2], [4, 2, 4]])  # an image; videos of 2, 3 (odd) and 4 frames
    hidden_states = torch.randn(int(grids.prod(-1).sum()) // 4, 8)
    at_once = _patch_ernie_vl_frame_pairs_at_once(Resampler._temporal_slicing)(resampler, hidden_states, grids)
    torch.testing.assert_close(at_once, Resampler._temporal_slicing(resampler, hidden_states, grids))


def test_video_llama3_blocks_shrunk_at_once_are_eagers_image_by_image():
    from transformers.models.video_llama_3.modeling_video_llama_3 import VideoLlama3VisionModel

    from exporters.exporter_dynamo import _patch_video_llama3_blocks_shrunk_at_once

    original = VideoLlama3VisionModel.pixel_unshuffle
    grids = torch.tensor([[1, 4, 6], [2, 4, 4], [1, 6, 6], [3, 2, 4]])  # images and videos of 2 and 3 frames
    merges = torch.tensor([1, 2, 3, 2])  # kept, the middle four of each block, its middle one
    hidden_states = torch.randn(int(grids.prod(-1).sum()), 8)
    at_once = _patch_video_llama3_blocks_shrunk_at_once(original)(None, hidden_states, grids, merges)
    torch.testing.assert_close(at_once, original(None, hidden_states, grids, merges))


def test_hunyuan_vl_positions_and_merged_images_at_once_are_eagers_image_by_image():
    from exporters.utils import apply_patches

    tower = _built_by_the_sweep("HunYuanVLVisionTransformer").model
    grids = torch.tensor([[1, 4, 6], [1, 6, 4], [1, 2, 2], [1, 5, 7]])  # odd sides lose a row or column of blocks
    pixel_values = torch.randn(int(grids.prod(-1).sum()), 3 * tower.config.patch_size**2)
    with torch.no_grad():
        by_image = tower(pixel_values, grids)
        with apply_patches("dynamo", select=lambda path: ".modeling_hunyuan_vl.HunYuanVLVision" in path):
            at_once = tower(pixel_values, grids)
    assert set(at_once) == set(by_image) == {"last_hidden_state", "pooler_output"}
    for name in by_image:
        torch.testing.assert_close(at_once[name], by_image[name], msg=name)


def test_glm_image_source_grids_and_tokens_of_one_map_are_eagers_image_by_image():
    from transformers.models.glm_image.modeling_glm_image import GlmImageModel

    from exporters.exporter_dynamo import _patch_glm_image_features_as_one_map, _patch_glm_image_source_grids_by_mask

    context = _built_by_the_sweep("GlmImageModel")
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


def test_radio_packed_images_and_nemotron_h_omni_shuffle_at_once_are_eagers_image_by_image():
    from exporters.exporter_dynamo import (
        _patch_nemotron_h_omni_images_shuffled_at_once,
        _patch_radio_packed_images_at_once,
    )

    model = _built_by_the_sweep("NemotronH_Omni_Reasoning_V3").model
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


@pytest.mark.parametrize("name", ["TimesFmModelForPrediction", "TimesFm2_5ModelForPrediction"])
def test_timesfm_series_as_one_batch_forecast_like_eager_series_by_series(name):
    from exporters.utils import apply_patches

    model = _built_by_the_sweep(name).model
    context = model.context_len
    # padded in front; as they are; longer than TimesFM's own context, which its padding cuts them to
    longer = context + model.config.patch_length  # TimesFM 2.5 patches its context: a whole number of patches
    for length, forecast_context in ((context - 5, None), (context, None), (longer, longer)):
        past_values = torch.randn(3, length, generator=torch.Generator().manual_seed(length))
        options = {"forecast_context_len": forecast_context}
        with torch.no_grad():
            by_series = exporters.named_leaves(model(past_values=list(past_values), **options))
            with apply_patches("dynamo", select=lambda path: ".modeling_timesfm" in path):
                at_once = exporters.named_leaves(model(past_values=past_values, **options))
        assert at_once.keys() == by_series.keys()
        for output in by_series:
            torch.testing.assert_close(at_once[output], by_series[output], msg=f"{length}: {output}")


@pytest.mark.parametrize("name", ["Qwen2_5OmniThinkerModel", "Qwen3OmniMoeThinkerModel"])
def test_omni_audio_chunks_on_a_grid_are_eagers_chunks(name):
    from exporters.exporter_dynamo import _patch_omni_audio_chunks_on_a_grid, segmented_attention

    model = _built_by_the_sweep(name).model
    tower = model.audio_tower
    width = 2 * tower.n_window
    frames = 3 * width - 5  # the last chunk of a full sample is short
    kept = torch.arange(frames)[None] < torch.tensor([frames, width + 3, width, 7])[:, None]
    holed = torch.arange(frames) % 3 != 1  # a mask that keeps frames past dropped ones
    masks = torch.cat([kept, holed[None]]).long()
    features = torch.randn(len(masks), tower.num_mel_bins, frames)
    features.transpose(1, 2)[masks == 0] = float("nan")  # dropped frames must not reach the chunks
    original = type(model).get_audio_features
    with torch.no_grad():
        chunk_by_chunk = original(model, features, masks)
        with segmented_attention(model, set()):  # as exported: a chunk past a sample's frames attends to nothing
            on_a_grid = _patch_omni_audio_chunks_on_a_grid(original)(model, features, masks)
    torch.testing.assert_close(on_a_grid.last_hidden_state, chunk_by_chunk.last_hidden_state)


class _AudioFeatures(torch.nn.Module):
    """A thinker's audio path alone: its features for frames and their mask."""

    def __init__(self, thinker):
        super().__init__()
        self.thinker = thinker

    def forward(self, input_features, feature_attention_mask):
        return self.thinker.get_audio_features(input_features, feature_attention_mask).last_hidden_state


def test_executorch_plans_memory_for_the_omni_audio_pairs():
    """Qwen2.5-Omni averages its audio positions in pairs, counted from the data: bounded by the frames given."""
    thinker = _built_by_the_sweep("Qwen2_5OmniThinkerModel").model
    model, bins = _AudioFeatures(thinker).eval(), thinker.audio_tower.num_mel_bins

    def inputs(lengths, frames):
        return {"input_features": torch.randn(len(lengths), bins, frames),
                "feature_attention_mask": (torch.arange(frames) < torch.tensor(lengths)[:, None]).long()}

    exporter, config = exporters.exporter_for("executorch", dynamic=True)
    exported = exporter.export(model, inputs([30, 17], 30), config)
    assert "_patch_omni_audio_chunks_on_a_grid" in exported.applied
    other = inputs([41, 9, 26], 41)
    with torch.no_grad():
        expected = model(**other)
    (features,) = exported(**other).values()
    torch.testing.assert_close(features, expected, atol=TOLERANCE["executorch"], rtol=TOLERANCE["executorch"])


class _RecastTable(torch.nn.Module):
    """CTRL: a position table reassigned in the forward, cast to the dtype it already has; the trace records an
    update of the buffer."""

    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.arange(1.0, 13.0).reshape(6, 2), persistent=False)

    def forward(self, positions):
        self.table = self.table.to(dtype=torch.float32)
        return self.table[positions]


def test_executorch_starts_a_buffer_the_program_updates_from_its_value():
    model, inputs = _RecastTable().eval(), {"positions": torch.tensor([[0, 5, 2]])}
    exported = _export_module(model, inputs, "executorch")
    _assert_runs_like_eager(exported, model, inputs)  # ExecuTorch's default leaves it unset: zeros here
