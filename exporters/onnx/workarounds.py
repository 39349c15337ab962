"""The ONNX exporter's workarounds, by stage, in the order the stages run (``exporter.py`` says what each does).

1. torch patches: torch ops the ONNX lowering cannot take as the model calls them;
2. ONNX patches: the converter's and the optimizer's internals;
3. FX node fixes: graph rewrites before conversion, run again after decompositions;
4. ONNX translations: aten ops lowered by our own onnxscript functions;
5. ONNX IR fixes: rewrites of the finished graph for ONNX Runtime bugs.
"""

from __future__ import annotations

import contextvars
from contextlib import contextmanager

import torch

from ..registration import (
    ONNX_TRANSLATIONS,
    applied_reporter,
    apply_fx_node_fixes,
    register_fx_node_fix,
    register_onnx_ir_fix,
    register_onnx_translation,
    register_patch,
    report_applied,
)
from ..rewrites import contiguous_copy, running_extremes_by_comparison, without_autograd_for_scans
from ..stages import StageLog

# ── Stage 1: Torch patches ───────────────────────────────────────────────────
# `@register_patch("onnx", "torch.<op>")`: replace a torch op the ONNX lowering cannot take as the model calls it.


@register_patch(
    "onnx", "torch.cummax", "torch.cummin",
    model_side="upstream change: onnxscript's torchlib should implement aten::cummax/aten::cummin (both still "
               "raise NotImplementedError in onnxscript 0.7.2), e.g. as a comparison-based or Scan-based running"
               " extreme, so torch.onnx can translate them.",
)
def _patch_running_extremes_by_comparison(original):
    """ONNX has no running maximum or minimum, and torch.onnx no function for `cummax` or `cummin` (Grounding DINO
    finds each token's previous and next special tokens by them). Position i's extreme is that of the row with the
    values after i replaced by the value at i; its index, the last position holding it, which is i itself when the
    value at i is the extreme."""
    return running_extremes_by_comparison(original)


# ── Stage 2: ONNX patches ────────────────────────────────────────────────────
# `@register_patch("onnx", "torch.onnx._internal....")`: hooks into the converter itself.

_ACTIVE_LOG: contextvars.ContextVar[StageLog | None] = contextvars.ContextVar("onnx_stage_log", default=None)


@contextmanager
def conversion_log(log: StageLog):
    """The stage log the stage 2 hooks record into, while ``OnnxExporter`` converts."""
    token = _ACTIVE_LOG.set(log)
    try:
        yield
    finally:
        _ACTIVE_LOG.reset(token)


@register_patch(
    "onnx", "torch.onnx._internal.exporter._core._prepare_exported_program_for_export",
    model_side="upstream change: torch.onnx's decomposition step (_prepare_exported_program_for_export / "
               "run_decompositions) should not introduce nodes its own translator cannot handle (rsub.Scalar "
               "rewritten to sub.Tensor with a Python number, SDPA decomposed to a layout its recorded views "
               "refuse), so the project's FX node fixes need not be re-run after it.",
)
def _patch_refix_after_decompositions(original):
    """Decompositions add nodes (shape guards, aliases) after stage 3 ran: run the FX node fixes on them too."""

    def prepare(exported_program, *args, **kwargs):
        log = _ACTIVE_LOG.get()
        if log is None:  # an ONNX export outside OnnxExporter
            return original(exported_program, *args, **kwargs)
        with log.stage("decompositions"), without_autograd_for_scans(exported_program):
            prepared = original(exported_program, *args, **kwargs)
            apply_fx_node_fixes("onnx", prepared.graph_module, log.applied)
            translated = {node.target for node in prepared.graph.nodes} & set(ONNX_TRANSLATIONS)
            log.note(sorted(ONNX_TRANSLATIONS[target].__name__ for target in translated))
        return prepared

    return prepare


CONVERSION_HOOK = _patch_refix_after_decompositions.__name__  # a hook of the exporter's stages, not a workaround


@register_patch(
    "onnx", "torch.onnx._internal.exporter._core._handle_output_node", reports=True,
    model_side="upstream change: torch.onnx's _handle_output_node should accept program outputs that are Python "
               "numbers (constant int/float outputs of an ExportedProgram) instead of failing with \"'int' object"
               " has no attribute 'name'\".",
)
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


@register_patch(
    "onnx", *(f"{_MIN_MAX_RULES}.{rule}.compute_constants" for rule in (
    "FuseSuccessiveMin", "FuseSuccessiveMax", "FuseMaxMinToClip", "FuseMinMaxToClip")), reports=True,
    upstream="https://github.com/microsoft/onnxscript/issues/2079",
)
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
    "onnx", "onnxscript.optimizer._constant_folding.PartialEvaluatorRegistry.lookup_evaluators", reports=True,
    model_side="upstream change: onnxscript's SplitToSequence constant-folding evaluator "
               "(optimizer/_constant_folding.py split_to_sequence) should leave the node alone when `split` is a"
               " scalar with a static shape but no constant value, instead of dereferencing `split_value.ndim` "
               "on None.",
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


@register_patch(
    "onnx", "onnxscript.rewriter._matcher.SimplePatternMatcher._match_constant", reports=True,
    model_side="upstream change: onnxscript's no-op rewrite rules (x+0, x-0, x*1, x/1) should match a constant "
               "only when it is exactly the identity value, not within the pattern matcher's default absolute "
               "tolerance (math.isclose abs_tol), which deletes small epsilons such as 1e-8.",
)
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


@register_fx_node_fix(
    "onnx",
    upstream="https://github.com/pytorch/pytorch/issues/194381",
)
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


@register_fx_node_fix(
    "onnx",
    upstream="https://github.com/pytorch/pytorch/issues/141107",
)
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


@register_fx_node_fix(
    "onnx",
    model_side="upstream change: onnxscript's torchlib aten_squeeze_dim/aten_squeeze_dims should follow torch "
               "semantics and not emit an ONNX Squeeze for an axis whose size is (or may be) other than 1 \u2014 "
               "return the input for axes statically known not to be 1 and guard dynamic ones.",
)
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


@register_fx_node_fix(
    "onnx",
    model_side="upstream change: onnxscript's torchlib aten_remainder_scalar should accept a symbolic (SymInt) "
               "divisor, turning it into a tensor instead of building ir.tensor(other) from a Python number, so "
               "`x % n` with a dynamic size translates.",
)
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


@register_onnx_translation(
    torch.ops.aten._is_all_true.default,
    model_side="upstream change: torch.onnx (onnxscript torchlib) should translate aten._is_all_true, e.g. as a "
               "ReduceMin over the values cast to integers, so `Tensor.all()` used as a Python condition "
               "exports.",
)
def _aten__is_all_true(self):
    """`Tensor.all()` used as a Python condition (vision-language models check their image tokens in generate's
    prefill) traces as `_is_all_true`, which torch.onnx has no function for. All true is a minimum of one over the
    values as integers; an empty tensor's minimum is the largest integer, true as ONNX casts it."""
    from onnxscript import opset18 as op

    return op.Cast(op.ReduceMin(op.Cast(self, to=7), keepdims=0), to=9)  # 7: INT64, 9: BOOL


@register_onnx_translation(
    torch.ops.aten.searchsorted.Tensor,
    upstream="https://github.com/pytorch/pytorch/issues/151793",
)
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


@register_onnx_translation(
    torch.ops.aten.randperm.default,
    model_side="upstream change: onnxscript's torchlib should implement aten::randperm (still "
               "NotImplementedError in 0.7.2), e.g. as the TopK/argsort order of RandomUniformLike draws.",
)
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


@register_onnx_translation(
    torch.ops.aten.bernoulli.default,
    model_side="upstream change: ONNX Runtime's CPU Bernoulli kernel should output 1 with probability p (not 1 -"
               " p), so onnxscript's aten_bernoulli (a bare op.Bernoulli) matches torch.bernoulli.",
)
def _aten_bernoulli(self, generator=None):
    """ONNX Runtime's `Bernoulli` (1.32, CPU) draws one with the complement of each probability: a mask of
    probability 0 came out all ones (Perceiver's multimodal preprocessor masks no modality but the label, and
    every modality came out masked). A draw is one where a uniform number falls below its probability."""
    from onnxscript import opset18 as op

    return op.CastLike(op.Less(op.RandomUniformLike(self, high=1.0, low=0.0), self), self)


@register_onnx_translation(
    torch.ops.aten.sym_numel.default,
    upstream="https://github.com/pytorch/pytorch/issues/128882",
)
def _aten_sym_numel(self):
    """The element count of a tensor whose shape the trace does not know (a vision tower's packed image sequence
    read as `x.numel()`), which torch.onnx has no function for: ONNX's `Size`."""
    from onnxscript import opset18 as op

    return op.Size(self)


# ── Stage 5: ONNX IR fixes ───────────────────────────────────────────────────
# `@register_onnx_ir_fix` on `_fix_ir_<what>(model: onnx_ir.Model) -> bool`.


@register_onnx_ir_fix(
    upstream="https://github.com/microsoft/onnxruntime/issues/24127",
)
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
