"""The exporters' own stages, which no workaround can switch off: the names a program takes and returns, the inputs it
bakes in as constants (sizes in a static export, a cache's numbers), the state cleanup around the trace,
ExecuTorch's initial buffer values, the work ExecuTorch's lowering is spared (decompositions, graph code, size
expressions' facts).
"""

import collections
import copy
from contextlib import contextmanager, nullcontext

import pytest
import torch

import exporters
from exporters.leaves import split_inputs

from .conftest import TOLERANCE, assert_parity
from .workarounds.modules import (
    FeatureMapSizes,
    RecastTable,
    assert_runs_like_eager,
    built_by_the_sweep,
    export_module,
    export_tiny,
)


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


def test_an_export_does_not_reuse_what_dynamo_compiled_for_an_earlier_one():
    """RecurrentGemma's recurrence is a `scan`, whose body Dynamo compiles. Its code cache outlived the export: a
    dynamic export after the model's generate programs reused the body compiled for them, with the batch fixed
    ("Guard failed: 2 == input_ids.size()[0]" on the second input set, a batch of 3)."""
    from exporters.generation import export_for_generation, generation_prompt
    from harness.cells import export_options

    context = built_by_the_sweep("RecurrentGemmaForCausalLM")
    export_for_generation(context.model, generation_prompt(context.model, context.inputs["A"]), "dynamo")
    exporter, config = exporters.exporter_for("dynamo", **export_options("dynamic", context.inputs))
    exported = exporter.export(context.model, context.inputs["A"], config)
    assert context.inputs["B"]["input_ids"].shape[0] != context.inputs["A"]["input_ids"].shape[0]
    assert_parity(exported(**context.inputs["B"]), context.expected["B"], TOLERANCE["dynamo"])


def test_a_static_export_keeps_the_values_of_small_tensors_the_forward_builds(monkeypatch):
    model, inputs = FeatureMapSizes(), {"features": torch.randn(2, 8, 4, 5), "queries": torch.randn(2, 1, 3, 8)}
    exported = export_module(model, inputs, "dynamo")
    assert torch.equal(exported(**inputs)["output"], model(**inputs))
    monkeypatch.setattr("exporters.dynamo.exporter._SIZE_NUMEL_LIMIT", 1)  # torch's own: values of one element
    with pytest.raises(exporters.ExportError, match="data-dependent"):
        export_module(model, inputs, "dynamo")


@pytest.mark.parametrize("name, size_input, backend", [
    # its audio frames chunked by the number the mask marks real (exportable unbaked too, on a grid of chunks)
    ("Qwen2_5OmniThinkerForConditionalGeneration", "feature_attention_mask", "dynamo"),
    # its per-image merge factors: traced, a reshape by them left ExecuTorch a view of unplannable size
    ("VideoLlama3VisionModel", "merge_sizes", "dynamo"),
])  # fmt: skip
def test_a_static_export_bakes_in_the_image_and_audio_geometry(name, size_input, backend):
    context = built_by_the_sweep(name)
    exported = export_tiny(context, backend)
    assert size_input not in exported.input_names and "size_inputs_as_constants" in exported.applied
    assert_parity(exported(**context.inputs["A"]), context.expected["A"], TOLERANCE[backend])
    with pytest.raises(ValueError, match=f"{size_input}=.* differs from the value baked"):
        exported(**{**context.inputs["A"], size_input: context.inputs["A"][size_input] * 2})
    assert size_input in split_inputs(context.inputs["A"])[0]  # a dynamic export traces it


def test_a_cache_count_another_layer_holds_is_read_from_its_length_and_any_other_is_refused():
    """Diffusion Gemma's decoder reads a prompt cache. Its sliding layer (full: a window of 4) counts the prompt's
    tokens in a Python int, which the trace baked in, and a prompt of another length was refused. The full-attention
    layer holds every token, so the count is now read from its keys' length. A count no layer holds stays baked in:
    a call with another was computed with the wrong positions, silently, so it is refused."""
    context = built_by_the_sweep("DiffusionGemmaDecoderModel")
    exported = export_tiny(context, "dynamo", dynamic=True)
    assert_parity(exported(**context.inputs["B"]), context.expected["B"], TOLERANCE["dynamo"])
    inputs = copy.deepcopy(context.inputs["B"])
    inputs["past_key_values"].layers[0].cumulative_length = 9
    with pytest.raises(ValueError, match=r"past_key_values .*\(layers\.0\.cumulative_length: 9, exported with the "
                                         r"length of layers\.1\.keys\)"):
        exported(**inputs)


def test_eomt_mask_annealing_is_read_as_the_numbers_its_buffer_holds(monkeypatch):
    context = built_by_the_sweep("EomtForUniversalSegmentation")
    model, inputs = context.model, context.inputs["A"]
    state_keys = list(model.state_dict())
    model.attn_mask_probs[0] = 0.0  # the first masked block annealed away: its queries see the whole image
    expected = context._forward(inputs)
    assert not torch.allclose(expected["class_queries_logits"], context.expected["A"]["class_queries_logits"])
    exported = export_module(model, inputs, "dynamo")
    assert_parity(exported(**inputs), expected, TOLERANCE["dynamo"])
    assert list(model.state_dict()) == state_keys and "attn_mask_probs" in model._buffers
    monkeypatch.setattr("exporters.dynamo.exporter._BUFFERS_READ_AS_NUMBERS", ())
    with pytest.raises(exporters.ExportError, match="data-dependent"):
        export_module(model, inputs, "dynamo")


def test_executorch_starts_a_buffer_the_program_updates_from_its_value():
    model, inputs = RecastTable().eval(), {"positions": torch.tensor([[0, 5, 2]])}
    exported = export_module(model, inputs, "executorch")
    assert_runs_like_eager(exported, model, inputs)  # ExecuTorch's default leaves it unset: zeros here


@pytest.mark.parametrize("dynamic", [False, True])
def test_executorch_lowers_the_same_program_with_its_cost_cuts(tiny, monkeypatch, dynamic):
    """to-edge skips the two of its three re-traces that change nothing (the empty-table pass; the last one, whose
    table only a dynamic program's size queries use), to-edge and to-executorch make a graph's Python code only when
    it is called or read, the export walks a size expression once for each of its facts, XNNPACK's partitioner tests
    a merge from the pair's side, the graph is sorted in place after each partition, and the program serialized is
    the same byte for byte."""
    from torch.export import ExportedProgram

    from exporters.executorch.backends import warm_up_xnnpack

    model = tiny("BertModel")
    warm_up_xnnpack()  # its first use lowers reference graphs: decompositions that are not the export's
    retraces, generated = [], []
    run_decompositions, python_code = ExportedProgram.run_decompositions, torch.fx.Graph.python_code

    def counted_retrace(self, *args, **kwargs):
        retraces.append(1)
        return run_decompositions(self, *args, **kwargs)

    def counted_code(self, *args, **kwargs):
        generated.append(1)
        return python_code(self, *args, **kwargs)

    monkeypatch.setattr(ExportedProgram, "run_decompositions", counted_retrace)
    monkeypatch.setattr(torch.fx.Graph, "python_code", counted_code)
    with_cuts = export_tiny(model, "executorch", dynamic)
    with_cuts_counts = len(retraces), len(generated)
    monkeypatch.setattr("exporters.executorch.exporter.redundant_decompositions_skipped", lambda *_: nullcontext())
    monkeypatch.setattr("exporters.executorch.exporter.graph_code_on_demand", nullcontext)
    monkeypatch.setattr("exporters.expression_facts.expression_facts_remembered", nullcontext)
    monkeypatch.setattr("exporters.executorch.exporter.partition_merging_over_the_pair", nullcontext)
    monkeypatch.setattr("exporters.executorch.exporter.graph_sorted_in_place", nullcontext)
    retraces.clear()
    generated.clear()
    without_cuts = export_tiny(model, "executorch", dynamic)
    assert (with_cuts_counts[0], len(retraces)) == (1, 3)
    assert with_cuts_counts[1] * 2 < len(generated), (with_cuts_counts[1], len(generated))  # 190 against 3,185
    assert with_cuts.program == without_cuts.program
    assert_parity(with_cuts(**model.inputs["B" if dynamic else "A"]), model.expected["B" if dynamic else "A"],
                  TOLERANCE["executorch"])  # fmt: skip



def test_onnx_builds_the_torchlib_registry_once_and_exports_the_same_program(tiny, monkeypatch):
    import onnx_ir
    from torch.onnx._internal.exporter._registration import ONNXRegistry

    builds = []
    build = ONNXRegistry.__dict__["from_torchlib"].__func__

    def counted_build(cls, *args, **kwargs):
        builds.append(1)
        return build(cls, *args, **kwargs)

    monkeypatch.setattr(ONNXRegistry, "from_torchlib", classmethod(counted_build))
    monkeypatch.setattr("exporters.onnx.torchlib_registry._BUILT", {})  # as in a process that has built none yet
    model = tiny("BertModel")
    once = [onnx_ir.to_proto(export_tiny(model, "onnx").program).SerializeToString() for _ in range(2)]
    assert len(builds) == 1
    monkeypatch.setattr("exporters.onnx.exporter.torchlib_registry_built_once", nullcontext)
    builds.clear()
    each_time = onnx_ir.to_proto(export_tiny(model, "onnx").program).SerializeToString()
    assert len(builds) == 1  # one per export without the cut
    assert once[0] == once[1] == each_time
    assert ONNXRegistry.__dict__["from_torchlib"].__func__ is counted_build  # restored after each export


def test_xnnpack_merges_the_same_partitions_when_it_tests_a_merge_from_the_pairs_side(tiny, monkeypatch):
    from executorch.exir.backend.canonical_partitioners.group_partitioner import GroupBasedPartitioner

    from exporters.executorch import partition_merging

    upstream = GroupBasedPartitioner.__dict__["_can_merge_partitions"]
    answers = collections.Counter()

    @contextmanager
    def compared():
        with partition_merging.partition_merging_over_the_pair():
            ours = GroupBasedPartitioner.__dict__["_can_merge_partitions"]
            assert ours is not upstream

            def both(self, *args):
                answers[upstream(self, *args), ours(self, *args)] += 1
                return ours(self, *args)

            GroupBasedPartitioner._can_merge_partitions = both
            yield

    monkeypatch.setattr("exporters.executorch.exporter.partition_merging_over_the_pair", compared)
    export_tiny(tiny("BertModel"), "executorch", dynamic=True)
    assert set(answers) == {(True, True), (False, False)}, answers  # 112 merges, 1,002 refusals
    assert GroupBasedPartitioner.__dict__["_can_merge_partitions"] is upstream

def test_a_graph_sorted_in_place_after_each_partition_lowers_to_the_same_program(monkeypatch):
    """Wav2Vec2's dynamic lowering sorts its graph 30 times, with a chain of size arithmetic torch takes first: moved
    in place, the nodes come out in legalize_graph's order, with its names and its order of users, which the next
    sort walks (without that last, the size chain came out in another order)."""
    import executorch.exir.lowered_backend_module as lowered_backend_module

    from exporters.executorch import graph_sorting

    model = built_by_the_sweep("Wav2Vec2Model")
    sorts = []

    @contextmanager
    def counted():
        with graph_sorting.graph_sorted_in_place():
            assert lowered_backend_module.legalize_graph is graph_sorting.sort_in_place
            lowered_backend_module.legalize_graph = lambda module: sorts.append(1) or graph_sorting.sort_in_place(module)
            yield

    monkeypatch.setattr("exporters.executorch.exporter.graph_sorted_in_place", counted)
    sorted_in_place = export_module(model.model, model.inputs["A"], "executorch", dynamic=True)
    monkeypatch.setattr("exporters.executorch.exporter.graph_sorted_in_place", nullcontext)
    copied = export_module(model.model, model.inputs["A"], "executorch", dynamic=True)
    assert len(sorts) > 10 and sorted_in_place.program == copied.program
    assert lowered_backend_module.legalize_graph.__module__ == "torch.fx.passes.tools_common"  # restored


def test_the_in_place_sort_takes_first_the_ops_torchs_sort_takes_first():
    import ast
    import inspect
    import operator

    from torch.fx.passes.tools_common import legalize_graph

    from exporters.executorch.graph_sorting import _TAKEN_FIRST

    tree = ast.parse(inspect.getsource(legalize_graph).lstrip())
    (listed,) = [node.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
                 and getattr(node.targets[0], "id", None) == "PRIORITIZED_OPS"]  # fmt: skip
    names = {"operator": operator, "torch": torch}
    assert [eval(compile(ast.Expression(item), "<ops>", "eval"), names) for item in listed.elts] == list(_TAKEN_FIRST)


def test_a_graph_whose_input_name_a_new_graph_refuses_is_sorted_by_torch(monkeypatch):
    """torch.export names a placeholder after its input as is (`input`); a copied graph renames it `input_1`. The
    in-place sort would keep a name no copy has, so it leaves such a graph to torch's sort."""
    from torch.fx.passes.tools_common import legalize_graph

    from exporters.executorch.graph_sorting import sort_in_place

    class Add(torch.nn.Module):
        def forward(self, input, y):  # noqa: A002 - the name is the case
            return input + y

    def sorted_names(sort):
        module = torch.export.export(Add(), (torch.ones(2), torch.ones(2))).graph_module
        assert [node.name for node in module.graph.nodes][0] == "input"
        return [node.name for node in sort(module).graph.nodes]

    assert sorted_names(sort_in_place) == sorted_names(legalize_graph) == ["input_1", "y", "add", "output"]


def test_a_graph_module_made_with_code_on_demand_makes_it_when_called_or_when_its_specs_are_read():
    from torch.fx._lazy_graph_module import _LazyGraphModule

    from exporters.graph_code import graph_code_on_demand

    class Pair(torch.nn.Module):
        def forward(self, x):
            return {"double": x * 2, "next": x + 1}

    unlifted = torch.export.export(Pair(), (torch.ones(3),)).module()  # its graph's code is pytree-aware: it has specs
    with graph_code_on_demand():
        called, read = (torch.fx.GraphModule(unlifted, copy.deepcopy(unlifted.graph)) for _ in range(2))
    for module in (called, read):
        assert module._needs_recompile()  # nothing generated yet
    result = called(torch.ones(3))
    assert not called._needs_recompile() and sorted(result) == ["double", "next"]
    assert read._out_spec is not None  # a spec torch's lazy module leaves unset until it generates its code
    assert not read._needs_recompile()
    assert read._out_spec == unlifted._out_spec and read._in_spec == unlifted._in_spec
    with graph_code_on_demand():
        described = torch.fx.GraphModule(unlifted, copy.deepcopy(unlifted.graph))
    assert "code not generated yet" in str(described) and described._needs_recompile()  # a debug message's str
    assert "def forward" in described.code and "def forward" in str(described)
    assert not isinstance(torch.fx.GraphModule(unlifted, unlifted.graph), _LazyGraphModule)  # after: eager again


def test_an_expression_is_walked_once_for_its_facts_while_they_are_remembered():
    import sympy

    from exporters.expression_facts import expression_facts_remembered

    walks = []

    class Walked(sympy.Function):  # a size function like torch's FloorDiv, counting reads of its arguments
        @property
        def args(self):
            walks.append(self)
            return self._args

    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    expressions = [Walked(s0 * s1 + 2), Walked(sympy.Integer(3)), s0 + 1, sympy.Integer(4), sympy.Function("f")(1)]
    facts = [(e.is_number, e.free_symbols) for e in expressions]
    walks.clear()
    with expression_facts_remembered(), expression_facts_remembered():  # a nested use is the outer one
        remembered = [[(e.is_number, e.free_symbols) for e in expressions] for _ in range(3)]
        expressions[0].free_symbols.add(sympy.Symbol("changed"))  # a caller's own set, as sympy gives
        assert expressions[0].free_symbols == {s0, s1}
    assert remembered == [facts] * 3
    assert len(walks) == 4  # each of the two once for each fact: 14 times without the cut
    walks.clear()
    assert [(e.is_number, e.free_symbols) for e in expressions] == facts and len(walks) == 4  # sympy's own after
