"""OnnxExporter: a transformers model to an ONNX graph run by ONNX Runtime.

Built on ``torch.onnx.export(..., dynamo=True)`` of the Dynamo trace (see exporter_dynamo.py), in five stages:

1. torch patches: ``@register_patch("onnx", "torch....")``, active while the model is traced;
2. ONNX patches: ``@register_patch("onnx", "torch.onnx....")`` and other exporter internals, active during the
   conversion; one re-runs the FX node fixes after ``run_decompositions``, whose output has new nodes;
3. FX node fixes: ``@register_fx_node_fix("onnx")``, on the traced graph and again after decompositions;
4. ONNX translations: ``@register_onnx_translation(aten_op)`` (``_ONNX_TRANSLATION_TABLE``), for an aten op whose
   default lowering is missing or wrong;
5. ONNX IR fixes: ``@register_onnx_ir_fix`` (``_IR_FIXES``), on the finished graph, for ONNX Runtime bugs.

``OnnxConfig(optimize=False)`` skips the onnxscript optimizer (run between 4 and 5).
List every workaround: ``grep -nE "^def (_patch_|_fix_|_aten_)" exporters/exporter_onnx.py``.
"""

from __future__ import annotations

import contextvars
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from .exported import Exported, build_metadata
from .exporter_dynamo import DynamoConfig, trace_model
from .utils import (
    ONNX_IR_FIXES,
    ONNX_TRANSLATIONS,
    OnnxExportError,
    StageLog,
    apply_fx_node_fixes,
    apply_patches,
    applied_reporter,
    contiguous_copy,
    is_backend_internal,
    register_fx_node_fix,
    register_onnx_ir_fix,
    register_onnx_translation,
    register_patch,
    report_applied,
    without_autograd_for_scans,
)

_ONNX_TRANSLATION_TABLE = ONNX_TRANSLATIONS
_IR_FIXES = ONNX_IR_FIXES


@dataclass
class OnnxConfig(DynamoConfig):
    opset: int | None = None  # None: torch.onnx's default
    optimize: bool = True


class OnnxExported(Exported):
    backend = "onnx"
    program_file = "model.onnx"

    def __init__(self, program, metadata, session=None):
        super().__init__(program, metadata)
        self._session = session

    def _runtime(self):
        if self._session is None:
            import onnx_ir

            self._session = open_session(onnx_ir.to_proto(self.program).SerializeToString())
        return self._session

    session = property(_runtime)

    def _run(self, feed):
        session_inputs = {value.name for value in self.session.get_inputs()}
        named = {name: tensor.numpy() for name, tensor in zip(self.input_names, feed) if name in session_inputs}
        return [torch.from_numpy(array) for array in self.session.run(None, named)]

    def _save_program(self, path: Path) -> None:
        import onnx_ir

        onnx_ir.save(self.program, str(path), external_data=f"{path.name}.data")

    @classmethod
    def _load(cls, directory, metadata):
        import onnx_ir

        path = directory / cls.program_file
        return cls(onnx_ir.load(str(path)), metadata, session=open_session(str(path)))


def open_session(model):
    """An ONNX Runtime CPU session using as many threads as torch does here (the harness sets that one knob)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.log_severity_level = 3
    return onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])


class OnnxExporter:
    """``OnnxExporter().export(model, inputs, OnnxConfig(dynamic=True))`` -> a callable ``OnnxExported``."""

    def export(self, model: torch.nn.Module, inputs: dict, config: OnnxConfig | None = None) -> OnnxExported:
        config = config or OnnxConfig()
        log = StageLog(OnnxExportError)
        fired: set[str] = set()
        try:
            with ExitStack() as active:
                with log.stage("torch-patches"):
                    active.enter_context(apply_patches("onnx", fired, select=lambda path: not is_backend_internal(path)))
                traced = trace_model(model, inputs, config, log)
                traced = replace(traced, output_names=_computed_output_names(traced))
                active.close()  # torch patches serve the trace only
                with log.stage("fx-node-fixes"):
                    apply_fx_node_fixes("onnx", traced.program.graph_module, log.applied)
                with log.stage("onnx-patches"):
                    active.enter_context(apply_patches("onnx", fired, select=is_backend_internal))
                    active.enter_context(_conversion_log(log))
                with log.stage("onnx-translation"):
                    onnx_program = torch.onnx.export(
                        traced.program,
                        (),
                        kwargs={name: value for name, value in inputs.items() if name not in traced.constants},
                        input_names=traced.input_names,
                        output_names=traced.output_names,
                        custom_translation_table=_ONNX_TRANSLATION_TABLE,
                        opset_version=config.opset,
                        optimize=False,
                        dynamo=True,
                        verbose=False,
                    )
                    _name_inputs_and_outputs(onnx_program.model.graph, traced.input_names, traced.output_names)
                if config.optimize:  # with the patches on the optimizer's internals
                    with log.stage("optimize"):
                        onnx_program.optimize()
            with log.stage("ir-fixes"):
                log.note(fix.__name__ for fix in _IR_FIXES if fix(onnx_program.model))
        finally:
            fired.discard(_patch_refix_after_decompositions.__name__)  # the stage 2 hook itself, not a workaround
            log.note(sorted(fired))
        metadata = build_metadata("onnx", model, traced, config, log)
        return OnnxExported(onnx_program.model, metadata)


def _computed_output_names(traced) -> list[str]:
    """The names of the outputs the program computes. Python numbers a forward returns beside its tensors (the
    step Qwen3-Omni's code predictor is at) stay constants of the program; an ONNX graph leaves them out."""
    from torch.export.graph_signature import ConstantArgument, OutputKind

    specs = [spec for spec in traced.program.graph_signature.output_specs if spec.kind == OutputKind.USER_OUTPUT]
    return [name for name, spec in zip(traced.output_names, specs, strict=True)
            if not isinstance(spec.arg, ConstantArgument)]


def _name_inputs_and_outputs(graph, input_names: list[str], output_names: list[str]) -> None:
    """Give the graph's inputs and outputs our names. An output that is an input passed through (a decode step's
    cross-attention cache) becomes an Identity of it: one value cannot carry both names, and the converter would
    otherwise rename the input."""
    import onnx_ir

    for index, value in enumerate(list(graph.outputs)):
        if value.is_graph_input():
            identity = onnx_ir.node("Identity", [value])
            copy = identity.outputs[0]
            copy.shape, copy.type = value.shape, value.type
            graph.append(identity)
            graph.outputs[index] = copy
    for value, name in zip(graph.inputs, input_names):
        value.name = name
    for value, name in zip(graph.outputs, output_names):
        value.name = name


# ── Stage 1: Torch patches ───────────────────────────────────────────────────
# `@register_patch("onnx", "torch.<op>")`: replace a torch op the ONNX lowering cannot take as the model calls it.


@register_patch("onnx", "torch.cummax", "torch.cummin")
def _patch_running_extremes_by_comparison(original):
    """ONNX has no running maximum or minimum, and torch.onnx no function for `cummax` or `cummin` (Grounding DINO
    finds each token's previous and next special tokens by them). Position i's extreme is that of the row with the
    values after i replaced by the value at i; its index, the last position holding it, which is i itself when the
    value at i is the extreme."""
    largest = original is torch.cummax

    def running_extreme(input, dim):
        if not isinstance(input, torch.Tensor) or input.dim() == 0:
            return original(input, dim)
        row = input.movedim(dim, -1)
        positions = torch.arange(row.shape[-1], device=input.device)
        prefixes = torch.where(positions <= positions[:, None], row.unsqueeze(-2), row.unsqueeze(-1))
        values = prefixes.amax(dim=-1) if largest else prefixes.amin(dim=-1)
        holding = torch.where(prefixes == values.unsqueeze(-1), positions, 0).amax(dim=-1)
        indices = torch.minimum(holding, positions)
        result = torch.return_types.cummax if largest else torch.return_types.cummin
        return result((values.movedim(-1, dim), indices.movedim(-1, dim)))

    return running_extreme


# ── Stage 2: ONNX patches ────────────────────────────────────────────────────
# `@register_patch("onnx", "torch.onnx._internal....")`: hooks into the converter itself.

_ACTIVE_LOG: contextvars.ContextVar[StageLog | None] = contextvars.ContextVar("onnx_stage_log", default=None)


@contextmanager
def _conversion_log(log: StageLog):
    token = _ACTIVE_LOG.set(log)
    try:
        yield
    finally:
        _ACTIVE_LOG.reset(token)


@register_patch("onnx", "torch.onnx._internal.exporter._core._prepare_exported_program_for_export")
def _patch_refix_after_decompositions(original):
    """Decompositions add nodes (shape guards, aliases) after stage 3 ran: run the FX node fixes on them too."""

    def prepare(exported_program, *args, **kwargs):
        log = _ACTIVE_LOG.get()
        if log is None:  # an ONNX export outside OnnxExporter
            return original(exported_program, *args, **kwargs)
        with log.stage("decompositions"), without_autograd_for_scans(exported_program):
            prepared = original(exported_program, *args, **kwargs)
            apply_fx_node_fixes("onnx", prepared.graph_module, log.applied)
            translated = {node.target for node in prepared.graph.nodes} & set(_ONNX_TRANSLATION_TABLE)
            log.note(sorted(_ONNX_TRANSLATION_TABLE[target].__name__ for target in translated))
        return prepared

    return prepare


@register_patch("onnx", "torch.onnx._internal.exporter._core._handle_output_node", reports=True)
def _patch_constant_outputs_left_out(original):
    """The translator takes every output of the program for a node, and fails on a Python number (`'int' object has
    no attribute 'name'`). The numbers are not computed: left out of the graph, as from its output names."""

    def _handle_output_node(node, node_name_to_values, graph_like):
        outputs = node.args[0] if isinstance(node.args[0], (tuple, list)) else (node.args[0],)
        computed = tuple(output for output in outputs if output is None or isinstance(output, torch.fx.Node))
        if len(computed) == len(outputs):
            return original(node, node_name_to_values, graph_like)
        report_applied()
        arguments = node.args
        node.args = (computed, *arguments[1:])
        try:
            return original(node, node_name_to_values, graph_like)
        finally:
            node.args = arguments

    return _handle_output_node


_MIN_MAX_RULES = "onnxscript.rewriter.rules.common._min_max_to_clip"


@register_patch("onnx", *(f"{_MIN_MAX_RULES}.{rule}.compute_constants" for rule in (
    "FuseSuccessiveMin", "FuseSuccessiveMax", "FuseMaxMinToClip", "FuseMinMaxToClip")), reports=True)
def _patch_fused_bounds_named_by_their_node(original):
    """The optimizer fuses `Min`/`Max` pairs into one op whose bounds become initializers named after its input
    (`x_min`, `x_max`). Two fusions on one input (Gemma 4's audio tower clamps one activation three ways) name
    theirs alike, and the renamed copies never reach the graph (`'mul_8_min_1' is not a graph input`). Named after
    the node they replace, they are distinct."""

    def compute_constants(self, first_node, second_node, input_name=""):
        if not input_name:  # checking the bounds, not naming them
            return original(self, first_node, second_node)
        report_applied()
        return original(self, first_node, second_node, second_node.name)

    return compute_constants


@register_patch(
    "onnx", "onnxscript.optimizer._constant_folding.PartialEvaluatorRegistry.lookup_evaluators", reports=True
)
def _patch_split_by_a_symbolic_size_left_unfolded(original):
    """The optimizer turns `SplitToSequence` into `Split`s when it knows the split sizes or their count. A split
    size that is one symbolic number (a split by a length the export keeps dynamic; ProphetNet's decoder) gives
    neither, and the folding fails on it ("'NoneType' object has no attribute 'ndim'") instead of leaving the node,
    which ONNX Runtime runs as it is."""
    from onnxscript.optimizer._constant_folding import _get_numpy_value

    def unknown_scalar_split(node) -> bool:
        split = node.inputs[1] if len(node.inputs) > 1 else None
        return split is not None and split.shape is not None and split.shape.rank() == 0 and (
            _get_numpy_value(split) is None
        )

    def lookup_evaluators(self, domain, opname, version):
        evaluators = original(self, domain, opname, version)
        if (domain, opname) != ("", "SplitToSequence"):
            return evaluators

        report = applied_reporter()  # the evaluators run after this lookup returns

        def guarded(evaluator):
            def evaluate(node, op, state):
                if unknown_scalar_split(node):
                    report()
                    return None
                return evaluator(node, op, state)

            return evaluate

        return [guarded(evaluator) for evaluator in evaluators]

    return lookup_evaluators


@register_patch("onnx", "onnxscript.rewriter._matcher.SimplePatternMatcher._match_constant", reports=True)
def _patch_optimizer_zero_means_zero(original):
    """The optimizer's no-op rules (`x + 0`, `x - 0` -> `x`) match constants within an absolute tolerance of 1e-8,
    so they delete the epsilon of a norm or a division guard written as `+ 1e-8` or `+ 1e-15` (Muse Spark's audio
    tower), which changes results wherever the sum is that small. A constant matches a zero of the pattern only
    when it is zero."""

    def _match_constant(self, pattern_constant, value):
        matched = original(self, pattern_constant, value)
        if matched and pattern_constant._value == 0 and value.const_value.numpy().any():
            report_applied()
            return self.fail(f"Value {value.name} is not exactly zero.")
        return matched

    return _match_constant


# ── Stage 3: FX node fixes ───────────────────────────────────────────────────
# `@register_fx_node_fix("onnx")`: `fix(graph_module, node) -> bool`, True when it rewrote the node.


@register_fx_node_fix("onnx")
def _fix_number_minus_tensor(graph_module, node) -> bool:
    """`1.0 - mask` traces as `rsub.Scalar(mask, 1.0)`, which the ONNX decompositions rewrite into
    `sub.Tensor(1.0, mask)`, a number where the schema wants a tensor: no overload matches ("Cannot find a
    compatible OpOverload for aten.sub"; XLNet's input mask). `mask * -alpha + 1.0` is the same value and the
    same type promotion."""
    if node.op != "call_function" or node.target is not torch.ops.aten.rsub.Scalar:
        return False
    tensor, number = node.args[:2]
    alpha = node.args[2] if len(node.args) > 2 else node.kwargs.get("alpha", 1)
    with graph_module.graph.inserting_before(node):
        scaled = graph_module.graph.call_function(torch.ops.aten.mul.Scalar, (tensor, -alpha))
    scaled.meta["val"] = tensor.meta["val"] * -alpha if "val" in tensor.meta else None
    node.target, node.args, node.kwargs = torch.ops.aten.add.Scalar, (scaled, number), {}
    return True


@register_fx_node_fix("onnx")
def _fix_reshape_of_strided_view(graph_module, node) -> bool:
    """`reshape` of a transposed tensor: decompositions turn it into a `view` that their own strides then refuse.

    The trace sees SDPA's output in one layout and the decomposed SDPA produces another, so a reshape that was a
    view at trace time needs a copy after ("Cannot view a tensor with shape ..."; T5). A contiguous clone
    in front makes both layouts viewable; in ONNX it is an Identity the optimizer drops.
    """
    if node.target is not torch.ops.aten.reshape.default:
        return False
    source = node.args[0]
    layout_ops = (torch.ops.aten.transpose.int, torch.ops.aten.permute.default)
    if not isinstance(source, torch.fx.Node) or source.target not in layout_ops:
        return False
    with graph_module.graph.inserting_before(node):
        copy = contiguous_copy(graph_module.graph, source)
    node.replace_input_with(source, copy)
    return True


@register_fx_node_fix("onnx")
def _fix_squeeze_of_a_longer_axis(graph_module, node) -> bool:
    """`squeeze(dim)` leaves an axis longer than 1 as it is; torch.onnx still emits a Squeeze of it, which ONNX
    Runtime refuses when it loads or runs the model ("Dimension of input 0 must be 1 instead of 8"; Mistral 3's
    projector, a transducer's joint over a symbolic label length, which export keeps at 2 or more). Such axes
    leave the list, and a squeeze left with none is its input."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    if node.target not in (torch.ops.aten.squeeze.dim, torch.ops.aten.squeeze.dims):
        return False
    source, dims = node.args[:2]
    shape = source.meta["val"].shape
    dims = [dims] if isinstance(dims, int) else list(dims)
    kept = [dim for dim in dims if not statically_known_true(shape[dim] != 1)]
    if len(kept) == len(dims):
        return False
    if kept:
        node.target, node.args = torch.ops.aten.squeeze.dims, (source, kept)
    else:
        node.replace_all_uses_with(source)
        graph_module.graph.erase_node(node)
    return True


@register_fx_node_fix("onnx")
def _fix_remainder_by_a_symbolic_size(graph_module, node) -> bool:
    """`x % n` with `n` a size the trace keeps symbolic (Reformer's LSH buckets modulo its padded length) is
    `remainder.Scalar`, whose torch.onnx function reads `n` as a Python number ("int() argument must be ..., not
    'SymbolicTensor'"). `n` as a 0-d tensor of `x`'s type goes through the tensor overload, the same remainder."""
    if node.target is not torch.ops.aten.remainder.Scalar or not isinstance(node.args[1], torch.fx.Node):
        return False
    tensor, size = node.args[:2]
    with graph_module.graph.inserting_before(node):
        divisor = graph_module.graph.call_function(
            torch.ops.aten.scalar_tensor.default, (size,), {"dtype": tensor.meta["val"].dtype}
        )
    divisor.meta["val"] = tensor.meta["val"].new_empty(())
    node.target, node.args = torch.ops.aten.remainder.Tensor, (tensor, divisor)
    return True


# ── Stage 4: ONNX translations ───────────────────────────────────────────────
# `@register_onnx_translation(torch.ops.aten.<op>.<overload>)` on an onnxscript function `_aten_<op>`.


@register_onnx_translation(torch.ops.aten._is_all_true.default)
def _aten__is_all_true(self):
    """`Tensor.all()` used as a Python condition (vision-language models check their image tokens in generate's
    prefill) traces as `_is_all_true`, which torch.onnx has no function for. All true is a minimum of one over the
    values as integers; an empty tensor's minimum is the largest integer, true as ONNX casts it."""
    from onnxscript import opset18 as op

    return op.Cast(op.ReduceMin(op.Cast(self, to=7), keepdims=0), to=9)  # 7: INT64, 9: BOOL


@register_onnx_translation(torch.ops.aten.searchsorted.Tensor)
def _aten_searchsorted(sorted_sequence, self, out_int32=False, right=False, side=None, sorter=None):
    """torch.onnx has no function for `searchsorted` (Music Flamingo maps its encoder rows to their audio samples
    by it; decompositions of packed sequences bring it too). A value's insertion point in a sorted row is the
    number of the row's elements below it (at or below it, on the right)."""
    from onnxscript import opset18 as op

    if sorter is not None:
        raise NotImplementedError("searchsorted with a sorter")
    one_row = len(sorted_sequence.shape) == 1
    if sorted_sequence.dtype != self.dtype:  # torch compares them in a common type
        sorted_sequence, self = op.Cast(sorted_sequence, to=11), op.Cast(self, to=11)  # 11: DOUBLE
    values = op.Unsqueeze(self, [-1])
    rows = sorted_sequence if one_row else op.Unsqueeze(sorted_sequence, [-2])
    below = op.LessOrEqual(rows, values) if right or side == "right" else op.Less(rows, values)
    count = op.ReduceSum(op.Cast(below, to=7), [-1], keepdims=0)  # 7: INT64
    return op.Cast(count, to=6) if out_int32 else count  # 6: INT32


@register_onnx_translation(torch.ops.aten.randperm.default)
def _aten_randperm(n, dtype=None, layout=None, device=None, pin_memory=None):
    """ONNX has no random permutation (PatchTST's forecast masking shuffles its batch rows by one): the order that
    sorts n uniform draws is one, as likely as any other."""
    from onnxscript import opset18 as op

    if dtype not in (None, torch.int64):
        raise NotImplementedError(f"randperm into {dtype}")
    count = op.Reshape(n, [1])
    draws = op.RandomUniformLike(op.ConstantOfShape(count), dtype=1)  # 1: FLOAT
    _, order = op.TopK(draws, count)
    return order


@register_onnx_translation(torch.ops.aten.bernoulli.default)
def _aten_bernoulli(self, generator=None):
    """ONNX Runtime's `Bernoulli` (1.32, CPU) draws one with the complement of each probability: a mask of
    probability 0 came out all ones (Perceiver's multimodal preprocessor masks no modality but the label, and
    every modality came out masked). A draw is one where a uniform number falls below its probability."""
    from onnxscript import opset18 as op

    return op.CastLike(op.Less(op.RandomUniformLike(self, high=1.0, low=0.0), self), self)


@register_onnx_translation(torch.ops.aten.sym_numel.default)
def _aten_sym_numel(self):
    """The element count of a tensor whose shape the trace does not know (a vision tower's packed image sequence
    read as `x.numel()`), which torch.onnx has no function for: ONNX's `Size`."""
    from onnxscript import opset18 as op

    return op.Size(self)


# ── Stage 5: ONNX IR fixes ───────────────────────────────────────────────────
# `@register_onnx_ir_fix` on `_fix_ir_<what>(model: onnx_ir.Model) -> bool`.


@register_onnx_ir_fix
def _fix_ir_where_on_booleans(model) -> bool:
    """ONNX Runtime has no `Where` kernel for booleans ("Could not find an implementation for Where(16)"; LightGlue
    keeps a keypoint mask per pair that way): the same choice as logic, `(c and x) or (not c and y)`."""
    import onnx_ir

    rewritten = False
    for node in list(onnx_ir.traversal.RecursiveGraphIterator(model.graph)):
        if node.op_type != "Where" or node.domain not in ("", "ai.onnx"):
            continue
        if node.outputs[0].dtype != onnx_ir.DataType.BOOL:
            continue
        condition, chosen, otherwise = node.inputs
        negated = onnx_ir.node("Not", [condition])
        kept = onnx_ir.node("And", [condition, chosen])
        instead = onnx_ir.node("And", [negated.outputs[0], otherwise])
        either = onnx_ir.node("Or", [kept.outputs[0], instead.outputs[0]])
        node.graph.insert_before(node, [negated, kept, instead, either])
        old, new = node.outputs[0], either.outputs[0]
        new.shape, new.type = old.shape, old.type
        old.replace_all_uses_with(new, replace_graph_outputs=True)
        name, old.name = old.name, None
        node.graph.remove(node, safe=True)
        new.name = name
        rewritten = True
    return rewritten
