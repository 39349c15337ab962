"""The ExecuTorch workarounds of `exporters/executorch/lowering_patches.py` (stage 3, ExecuTorch patches): each passes
with its workaround and fails, or differs from eager, without it.
"""

import sys

import pytest
import torch

import exporters
from exporters.registration import apply_patches
from exporters.workarounds import disabled_workarounds

from ..conftest import TOLERANCE
from .modules import (
    ExpertCapacity,
    FusedProjection,
    GuardedProjection,
    NeighbourSums,
    PickedColumns,
    PositiveEntries,
    RelativeShift,
    RepeatedByCounts,
    SpaceToDepth,
    TOKENS,
    TanhGelu,
    TransposedAndItsCopy,
    VisibleTokenAttention,
    assert_runs_like_eager,
    check_class_case,
    check_dynamic_cell_case,
    check_pattern_case,
    crossed_chains,
    executorch_dynamic,
    export_module,
    planned_bytes,
)


CLASS_CASES = [  # (model class, tiny as the sweep builds it, backend, workaround, error without it)
    ("BltForCausalLM", "executorch", "_patch_views_as_dynamic_as_their_base", "_ViewSpec is incompatible"),
]


@pytest.mark.parametrize("name, backend, workaround, error", CLASS_CASES, ids=[case[2] for case in CLASS_CASES])
def test_a_model_class_exports_with_its_workaround_and_fails_without(name, backend, workaround, error):
    check_class_case(name, backend, workaround, error)


DYNAMIC_CELL_CASES = [  # (model class, backend, {workaround: (stage, message) of its dynamic cell without it})
    # SEW-D views its relative attention at a quotient of products of batch and frames (a chain of floors of the
    # samples): interval arithmetic bounded it 9,003 deep (345 MB in a 35 MB arena, refused at load); the exact
    # search runs over ~950,000 input sizes (batch 2 to 32 by 1,360 to 32,000 samples)
    ("SEWDModel", "executorch", {"_patch_sizes_bounded_exactly": ("load", "0x:21")}),
]  # fmt: skip


@pytest.mark.parametrize("name, backend, failures", DYNAMIC_CELL_CASES, ids=[case[0] for case in DYNAMIC_CELL_CASES])
def test_a_dynamic_cell_passes_with_its_workarounds_and_fails_without_each(name, backend, failures):
    check_dynamic_cell_case(name, backend, failures)


MODULE_CASES = [  # (backend, module, inputs, workaround, error without it)
    ("executorch", TransposedAndItsCopy, {"x": torch.randn(2, 3, 4)},
     "_patch_xnnpack_copies_of_shared_values", "is already in the inputs"),
    ("executorch", PickedColumns, {"x": torch.randn(2, 5, 8), "keep": torch.tensor([True, False, True, True, False])},
     "_patch_dim_order_of_contiguous_strides", r"data-dependent expression 8\*u\d+ < 8"),
]  # fmt: skip


@pytest.mark.parametrize("backend, module, inputs, workaround, error", MODULE_CASES, ids=[c[3] for c in MODULE_CASES])
def test_a_traced_pattern_exports_with_its_workaround_and_fails_without(backend, module, inputs, workaround, error):
    check_pattern_case(backend, module, inputs, workaround, error)


def test_executorch_data_dependent_sizes_get_an_upper_bound():
    from exporters.executorch.lowering_patches import _DATA_DEPENDENT_CEILING as ceiling

    model, tokens = RepeatedByCounts().eval(), torch.randn(3, 4)
    traced = {"tokens": tokens, "counts": torch.tensor([1, 2, 3])}
    exported = export_module(model, traced, "executorch")
    assert "_patch_sizes_bounded_exactly" in exported.applied
    for counts in ([5, 0, 9], [ceiling // 4, ceiling // 4, ceiling // 2]):  # past the traced total, up to the bound
        assert_runs_like_eager(exported, model, {"tokens": tokens, "counts": torch.tensor(counts)})
    with pytest.raises(RuntimeError, match="execute"):  # past the bound the runtime refuses to resize
        exported(tokens=tokens, counts=torch.tensor([ceiling // 2, ceiling // 2, 1]))
    with disabled_workarounds("_patch_sizes_bounded_exactly"):
        with pytest.raises(exporters.ExecutorchExportError, match="finite upper bound") as failure:
            export_module(model, traced, "executorch")
    assert failure.value.stage == "to-executorch"


def test_executorch_python_symbolic_ops_reach_the_edge_dialect():
    model = ExpertCapacity().eval()
    exported = executorch_dynamic(model, TOKENS["A"])
    assert "_patch_edge_verifier_python_symbolic_ops" in exported.applied
    assert_runs_like_eager(exported, model, TOKENS["B"])
    with disabled_workarounds("_patch_edge_verifier_python_symbolic_ops"):
        with pytest.raises(exporters.ExecutorchExportError) as failure:
            executorch_dynamic(model, TOKENS["A"])
    assert failure.value.stage == "to-edge"


def test_xnnpack_leaves_1d_convolutions_with_two_dynamic_axes_to_portable_kernels():
    # Wav2Vec2's feature encoder: strided convolutions over (batch, channels, samples), batch and samples dynamic
    model = torch.nn.Sequential(torch.nn.Conv1d(1, 4, 10, stride=5), torch.nn.GELU(), torch.nn.Conv1d(4, 4, 3, 2))
    model.eval()
    audio, other = {"input": torch.randn(2, 1, 400)}, {"input": torch.randn(3, 1, 240)}
    exported = executorch_dynamic(model, audio)
    assert "_patch_xnnpack_reshape_dynamic_axes" in exported.applied
    assert_runs_like_eager(exported, model, other)
    assert "_patch_xnnpack_reshape_dynamic_axes" not in export_module(model, audio, "executorch").applied, "static"
    with disabled_workarounds("_patch_xnnpack_reshape_dynamic_axes"):
        with pytest.raises(exporters.ExecutorchExportError, match="XNNPACK reshape only supports 1 dynamic"):
            executorch_dynamic(model, audio)


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
    model = FusedProjection().eval()
    exported = executorch_dynamic(model, TOKENS["A"])
    assert "_patch_edge_validator_list_return" in exported.applied
    assert isinstance(exported.metadata["input_shapes"]["tokens"][0], str), "batch stays a symbol"
    assert_runs_like_eager(exported, model, TOKENS["B"])
    with disabled_workarounds("_patch_edge_validator_list_return"):
        pinned = executorch_dynamic(model, TOKENS["A"])
    assert pinned.metadata["input_shapes"]["tokens"][0] == 2, "the validator's len() pinned the batch"


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


def test_executorch_retrace_asks_contiguity_without_a_guard():
    model, traced_on, run_on = NeighbourSums(), torch.tensor([0.0, 4.0]), torch.tensor([0.0, 4.0, 9.0])
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


def test_executorch_plans_a_selection_per_sample_for_the_samples_not_for_the_whole_mask():
    model, masked = VisibleTokenAttention().eval(), torch.zeros(2, 64, dtype=torch.bool)
    masked[:, ::2] = True
    traced = {"tokens": torch.randn(2, 64, 8), "masked": masked}
    exported = executorch_dynamic(model, traced)
    assert "_patch_counts_of_selected_elements_at_most_their_number" in exported.applied
    masked = torch.zeros(3, 80, dtype=torch.bool)
    masked[:, :60] = True
    assert_runs_like_eager(exported, model, {"tokens": torch.randn(3, 80, 8), "masked": masked})
    with disabled_workarounds("_patch_counts_of_selected_elements_at_most_their_number"):
        as_traced = executorch_dynamic(model, traced)
    # without the tie, the count is planned at the data-dependent ceiling whatever the mask holds: 4 times more here
    assert planned_bytes(as_traced) >= 4 * planned_bytes(exported)


def test_executorch_computes_the_tanh_gelu_asked_for():
    model, x = TanhGelu(), torch.linspace(-4, 4, 81).view(1, 81)  # the forms differ most near -2.7: 4.7e-4
    exporter, config = exporters.exporter_for("executorch")
    exported = exporter.export(model, {"x": x}, config)
    assert "_patch_xnnpack_exact_gelu_only" in exported.applied
    (tanh_form,) = exported(x=x).values()
    torch.testing.assert_close(tanh_form, model(x), atol=1e-6, rtol=1e-6)
    with disabled_workarounds("_patch_xnnpack_exact_gelu_only"):
        (delegated,) = exporter.export(model, {"x": x}, config)(x=x).values()
    assert (delegated - model(x)).abs().max() > 4e-4
    torch.testing.assert_close(delegated, torch.nn.functional.gelu(x), atol=1e-6, rtol=1e-6)  # the exact form


def test_executorch_splits_partitions_that_feed_one_another():
    from torch.fx.passes.infra.partitioner import Partition
    from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

    from exporters.executorch.lowering_patches import _patch_partitions_out_of_rings

    x = torch.randn(3, 4)
    module, ringed = crossed_chains()
    with pytest.raises(AssertionError, match="dependency cycles"):
        fuse_by_partitions(module, [dict.fromkeys(nodes) for nodes in ringed])
    module, ringed = crossed_chains()
    expected = module(x)
    proposed = [Partition(id=number, nodes=nodes) for number, nodes in enumerate(ringed)]
    partitions = _patch_partitions_out_of_rings(lambda partitioner: proposed)(None)
    assert sorted(len(partition.nodes) for partition in partitions) == [1, 1, 2]  # one split where its chain returns
    fused = fuse_by_partitions(module, [partition.nodes for partition in partitions])
    for got, want in zip(fused(x), expected, strict=True):
        assert torch.equal(got, want)


def test_executorch_runs_kernels_on_the_nonzero_of_a_vector():
    model = PositiveEntries().eval()
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


def test_xnnpack_leaves_tensors_of_more_than_six_axes_to_portable_kernels():
    model, frames = SpaceToDepth().eval(), torch.randn(1, 2, 3, 4, 4)
    exporter, config = exporters.exporter_for("executorch")
    exported = exporter.export(model, {"frames": frames}, config)
    assert "_patch_xnnpack_rank_limit" in exported.applied
    (got,) = exported(frames=frames).values()
    torch.testing.assert_close(got, model(frames), atol=TOLERANCE["executorch"], rtol=TOLERANCE["executorch"])
    with disabled_workarounds("_patch_xnnpack_rank_limit"):
        exported = exporter.export(model, {"frames": frames}, config)
        with pytest.raises(RuntimeError, match="0x:1"):  # XNNPACK cannot define the 8-axis tensor
            exported(frames=frames)


def test_executorch_plans_memory_for_the_largest_value_of_each_size():
    model = RelativeShift().eval()
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


@pytest.mark.parametrize("bound", [sys.maxsize - 1, 5000], ids=["int64", "a-loose-bound"])
def test_a_count_with_a_loose_bound_is_planned_within_the_data_dependent_ceiling(bound):
    # RADIO's count of kept tokens came bounded by int64's top: the exact search's range was too long to build, and
    # interval arithmetic's bound made memory offsets past 64 bits. FastSpeech2's frames came bounded at 5,000 by
    # its position table, and a decoder attending over them planned 17 GB.

    from executorch.exir import sym_util
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from exporters.executorch.lowering_patches import _DATA_DEPENDENT_CEILING

    shape_env = ShapeEnv()
    count = shape_env.create_unbacked_symint()
    shape_env.constrain_symbol_range(count.node.expr, compiler_min=0, compiler_max=bound)
    size = count * 4
    assert sym_util.eval_upper_bound(size) == 4 * bound
    with apply_patches("executorch", select=lambda path: path == "executorch.exir.sym_util.eval_upper_bound"):
        assert sym_util.eval_upper_bound(size) == 4 * _DATA_DEPENDENT_CEILING


def test_executorch_lowers_without_printing_the_guards_of_each_partition():
    model = GuardedProjection().eval()
    exporter, config = exporters.exporter_for("executorch", dynamic=True)
    exported = exporter.export(model, {"tokens": torch.randn(2, 5, 4)}, config)
    assert "_patch_guards_left_unprinted" in exported.applied, "a guarded dynamic program has guards to leave out"
    other = torch.randn(3, 7, 4)
    (got,) = exported(tokens=other).values()
    torch.testing.assert_close(got, model(other), atol=1e-5, rtol=1e-5)


def test_executorch_node_histories_are_shared_not_copied():
    from torch.fx.traceback import NodeSource

    from exporters.executorch.lowering_patches import _patch_node_history_shared  # registers it

    graph = torch.fx.Graph()
    node = graph.placeholder("tokens")
    node.meta["from_node"] = [NodeSource(None, "an earlier pass")]
    with apply_patches("executorch", select=lambda path: path.endswith("NodeSource.__init__")):
        assert NodeSource.__init__.__qualname__.startswith(_patch_node_history_shared.__name__)
        source = NodeSource(node, "a later pass")
    assert source.from_node[0] is node.meta["from_node"][0], "the recorded history is shared"
    assert source.from_node is not node.meta["from_node"], "the node's own list stays its own"
    model = GuardedProjection().eval()
    exporter, config = exporters.exporter_for("executorch")
    exported = exporter.export(model, {"tokens": torch.randn(2, 5, 4)}, config)
    assert "_patch_node_history_shared" in exported.applied
    tokens = torch.randn(2, 5, 4)
    (got,) = exported(tokens=tokens).values()
    torch.testing.assert_close(got, model(tokens), atol=1e-5, rtol=1e-5)
