"""ExecuTorch stage 3, ExecuTorch patches: lowering steps (``to_edge``, XNNPACK's partitioner, memory planning, the
emitter) that fail on valid graphs, patched while the program is lowered.
"""

from __future__ import annotations

import collections
import itertools
import math
import sys
import types

import torch

from ..registration import applied_reporter, register_patch, report_applied
from ..rewrites import contiguity_asked_without_guards


# ── Stage 3: ExecuTorch patches ──────────────────────────────────────────────
# `@register_patch("executorch", "executorch.<internal>")`: lowering steps that fail on valid graphs.

# `to_edge` traces the program again, asking the same contiguity questions as the first trace
@register_patch(
    "executorch", "torch._prims_common.is_contiguous", reports=True,
    upstream="https://github.com/pytorch/pytorch/issues/165032",
)
def _patch_contiguity_asked_without_guards(original):
    """The Dynamo patch of this name (`exporters/dynamo/patches/generic.py`, which says why), for the same
    questions asked again by `to_edge`'s re-trace."""
    return contiguity_asked_without_guards(original)


def _dynamic_axes(node) -> int:
    from torch.fx.experimental.symbolic_shapes import free_symbols

    value = node.meta.get("val")
    return sum(bool(free_symbols(size)) for size in value.shape) if isinstance(value, torch.Tensor) else 0


def _xnnpack_check_refusing(original, refuses):
    """An XNNPACK config's node check that also refuses the nodes `refuses` picks: they stay on the portable kernels."""

    def check(self, node, exported_program):
        if refuses(node):
            report_applied()
            return False
        return original(self, node, exported_program)

    return check


@register_patch(
    "executorch",
    "executorch.backends.xnnpack.partition.config.gemm_configs.ConvolutionConfig.check_constraints",
    "executorch.backends.xnnpack.partition.config.generic_node_configs.UnsqueezeCopyConfig.check_constraints",
    "executorch.backends.xnnpack.partition.config.node_configs.BatchNormConfig.check_constraints",
    reports=True,
    upstream="https://github.com/pytorch/executorch/pull/2976",
)
def _patch_xnnpack_reshape_dynamic_axes(original):
    """XNNPACK takes a 1-D convolution or batch norm (it wraps them in unsqueeze/squeeze) or an unsqueeze with two
    dynamic axes, then its reshape refuses them ("XNNPACK reshape only supports 1 dynamic dimension"; wav2vec2's
    feature encoder, Parakeet's convolution module, with dynamic batch and audio length). Such nodes stay on the
    portable kernels instead. The reshape's one-dynamic-dimension limit: https://github.com/pytorch/executorch/pull/2976"""

    def reshapes_two_dynamic_axes(node):
        source = node.args[0] if node.args and isinstance(node.args[0], torch.fx.Node) else node
        unsqueeze = "unsqueeze" in str(node.target)
        is_1d = len(getattr(source.meta.get("val"), "shape", ())) == 3
        return (unsqueeze or is_1d) and max(_dynamic_axes(source), _dynamic_axes(node)) > 1

    return _xnnpack_check_refusing(original, reshapes_two_dynamic_axes)


@register_patch(
    "executorch", "executorch.backends.xnnpack.partition.config.generic_node_configs.GeluConfig.check_constraints",
    reports=True,
    upstream="https://github.com/pytorch/executorch/pull/22851",
)
def _patch_xnnpack_exact_gelu_only(original):
    """XNNPACK serialises every GELU as the exact one and ignores `approximate="tanh"` (fixed after ExecuTorch
    1.5.1: https://github.com/pytorch/executorch/pull/22851); through TIPSv2's DPT head the 5e-4 difference grew to
    0.075. A tanh GELU stays on the portable kernel, which computes the tanh form."""

    def approximate(node):
        return node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none") != "none"

    return _xnnpack_check_refusing(original, approximate)


@register_patch(
    "executorch",
    "executorch.backends.xnnpack.partition.config.xnnpack_config.XNNPartitionerConfig.check_common_constraints",
    reports=True,
    model_side="upstream change: the ExecuTorch XNNPACK partitioner "
               "(XNNPartitionerConfig.check_common_constraints) should reject nodes whose inputs or outputs have"
               " more than XNN_MAX_TENSOR_DIMS (6) axes instead of lowering them into a delegate that fails at "
               "load with 'Failed to define tensor'.",
)
def _patch_xnnpack_rank_limit(original):
    """XNNPACK defines tensors of at most six axes, yet its partitioner takes a node of any rank: Perceiver's
    space-to-depth (an 8-axis permute) lowers, then the program fails to load ("Failed to define tensor", 0x1). A
    node that reads or writes a tensor past that rank stays on the portable kernels."""
    from executorch.backends.xnnpack.utils.xnnpack_constants import XNN_MAX_TENSOR_DIMS

    def past_the_rank_limit(node):
        values = [node.meta.get("val"), *(arg.meta.get("val") for arg in node.all_input_nodes)]
        return any(isinstance(value, torch.Tensor) and value.dim() > XNN_MAX_TENSOR_DIMS
                   for value in torch.utils._pytree.tree_leaves(values))

    return _xnnpack_check_refusing(original, past_the_rank_limit)


@register_patch(
    "executorch",
    "executorch.backends.xnnpack.partition.config.generic_node_configs.CloneDimOrderConfig.check_constraints",
    reports=True,
    model_side="upstream change: the ExecuTorch XNNPACK delegate should handle a layout-keeping clone it removes"
               " as a no-op when the copied value is also a partition output, instead of emitting the same value"
               " twice as a partition output ('Output node ... is already in the inputs').",
)
def _patch_xnnpack_copies_of_shared_values(original):
    """XNNPACK takes a copy that keeps the layout, then removes it from its partition as a no-op: where the value it
    copies leaves the partition too (RecurrentGemma's convolution output, transposed for its scan), the partition
    returns that value twice, which XNNPACK refuses ("Output node ... is already in the inputs"). A copy of a value
    read elsewhere stays on the portable kernels."""

    return _xnnpack_check_refusing(original, lambda node: len(node.args[0].users) > 1)


@register_patch(
    "executorch",
    "executorch.exir.backend.canonical_partitioners.group_partitioner.GroupBasedPartitioner.propose_partitions",
    reports=True,
    model_side="upstream change: ExecuTorch's GroupBasedPartitioner should check the merged partitions together "
               "for cycles (a ring across three or more partitions that each pass the pairwise check), not only "
               "each pair, before lowering hits 'Invalid partition, found dependency cycles'.",
)
def _patch_partitions_out_of_rings(original):
    """XNNPACK's group partitioner merges any two partitions whose union no path leaves and re-enters, judged on the
    graph's nodes, not on the partitions merged so far: each partition can pass and the partitions still feed one
    another in a ring, which lowering cannot fuse ("Invalid partition, found dependency cycles"; FLAVA's
    pretraining model). A partition in a ring is split where a path out of it comes back in."""
    from torch.fx.passes.infra.partitioner import Partition

    def propose_partitions(self):
        partitions = original(self)
        next_id = itertools.count(max((partition.id for partition in partitions), default=-1) + 1)
        while True:
            owner = {node: partition for partition in partitions for node in partition.nodes}
            ringed = _partitions_in_rings(partitions, owner)
            if not ringed:
                return partitions
            for partition in ringed:
                reentered = _reentered_nodes(partition, owner)
                # all of it only where another partition of the ring holds an earlier node: that one splits
                if 0 < len(reentered) < sum(node.op != "placeholder" for node in partition.nodes):
                    report_applied()
                    for node in reentered:
                        partition.remove_node(node)
                    partitions.append(Partition(id=next(next_id), nodes=reentered))
                    break
            else:
                raise AssertionError("a ring of partitions none of which a path re-enters")

    return propose_partitions


def _partition_edges(owner):
    """The graph with each partition (`owner` maps its nodes to it) as one node: the users of each node or
    partition. Constants a partition holds lead nowhere: the lowering copies them into every partition reading them."""
    users = collections.defaultdict(set)
    for node in next(iter(owner)).graph.nodes if owner else ():
        if node.op != "placeholder":
            source = owner.get(node, node)
            users[source].update(owner.get(user, user) for user in node.users)
            users[source].discard(source)
    return users


def _partitions_in_rings(partitions, owner) -> list:
    """The partitions on or past a cycle of the partition graph (what Kahn's order cannot reach), in order."""
    users = _partition_edges(owner)
    waiting = collections.Counter(user for targets in users.values() for user in targets)
    ready = [source for source in users if not waiting[source]]
    while ready:
        for user in users[ready.pop()]:
            waiting[user] -= 1
            if not waiting[user]:
                ready.append(user)
    return [partition for partition in partitions if waiting[partition] > 0]


def _reentered_nodes(partition, owner) -> list:
    """The nodes of `partition` that a path leaving it reaches, through other nodes and whole other partitions."""
    reached, expanded = set(), {partition}
    frontier = [user for node in partition.nodes if node.op != "placeholder" for user in node.users
                if owner.get(user) is not partition]
    while frontier:
        node = frontier.pop()
        if node in reached:
            continue
        reached.add(node)
        frontier.extend(node.users)
        other = owner.get(node)
        if other is not None and other not in expanded:  # a partition runs as one: all its outputs follow
            expanded.add(other)
            frontier.extend(user for member in other.nodes if member.op != "placeholder" for user in member.users)
    return [node for node in partition.nodes if node in reached]


@register_patch(
    "executorch", "executorch.exir.verification.arg_validator.EdgeOpArgValidator.call_function", reports=True,
    model_side="upstream change: ExecuTorch's EdgeOpArgValidator.call_function should treat an op whose only "
               "return is Tensor[] (split, unbind) as one list return instead of walking each tensor as a return"
               " and taking len() of the first, which guards the dynamic first axis to its traced size.",
)
def _patch_edge_validator_list_return(original):
    """The edge dialect's dtype validator walks an op's lone `Tensor[]` return (split, unbind) as if each tensor
    were a return, then takes `len()` of the first tensor: with a dynamic first axis, that `len` is a guard that
    pins the axis (the batch) to its traced size and the program rejects any other. Handed the list wrapped in a
    one-item list, the validator walks the single list return it is."""

    def call_function(self, target, args, kwargs):
        returns = getattr(getattr(target, "_schema", None), "returns", ())
        value = self.node.meta.get("val")
        if len(returns) != 1 or returns[0].type != torch.ListType.ofTensors() or not isinstance(value, (list, tuple)):
            return original(self, target, args, kwargs)
        report_applied()
        self.node.meta["val"] = [value]
        try:
            return original(self, target, args, kwargs)
        finally:
            self.node.meta["val"] = value

    return call_function


@register_patch(
    "executorch", "executorch.exir.program._program.EXIREdgeDialectVerifier", reports=True,
    model_side="upstream change: ExecuTorch's EXIREdgeDialectVerifier should accept the Python symbolic "
               "functions (torch.sym_float, sym_ite, sym_not, ...) that to_executorch already maps to "
               "executorch_prim ops via _PYTHON_SYM_OPS_TO_EXECUTORCH_SYM_OPS, instead of rejecting them as "
               "non-edge ops.",
)
def _patch_edge_verifier_python_symbolic_ops(original):
    """Size arithmetic traced as a Python function (NLLB-MoE's dynamic expert capacity, `torch.sym_float`; a tensor
    condition's `sym_ite`, a size's `sym_not` in the runtime asserts `to_edge` brings back when it traces again):
    the edge verifier refuses Python functions, although `to_executorch` swaps each for its `executorch_prim` op.
    The verifier lets those through."""
    from executorch.exir.passes.executorch_prim_ops_registry import _PYTHON_SYM_OPS_TO_EXECUTORCH_SYM_OPS

    swapped_later = {op for op in _PYTHON_SYM_OPS_TO_EXECUTORCH_SYM_OPS if isinstance(op, types.FunctionType)}

    def EXIREdgeDialectVerifier(*args, **kwargs):
        verifier = original(*args, **kwargs)
        verifier_class = verifier if isinstance(verifier, type) else type(verifier)
        check, report = verifier_class.check_valid_edge_op, applied_reporter()

        def check_valid_edge_op(self, op):
            if op in swapped_later:
                report()
                return None
            return check(self, op)

        verifier_class.check_valid_edge_op = check_valid_edge_op
        if not isinstance(verifier, type):
            verifier.check_valid_op = verifier.check_valid_edge_op
        return verifier

    return EXIREdgeDialectVerifier


@register_patch(
    "executorch", "executorch.exir.emit._emitter._Emitter._emit_scan", reports=True,
    model_side="upstream change: ExecuTorch's emitter (_Emitter._emit_scan) should write scan carries with an op"
               " that resizes its output (not copy_) and resize the stacked outputs to the current step's sizes "
               "before et_copy_index, so scans whose carries have a dynamic axis run below the planned upper "
               "bound.",
)
def _patch_scan_carries_resized(original):
    """ExecuTorch runs a `scan` as a loop that writes each carry into its buffer with `copy_`, which never resizes
    the buffer, and stacks each step's output with `et_copy_index`, which compares the step with the stack's
    trailing sizes as planned (the upper bounds). A scan whose carries have a dynamic axis (a batch of 3 in a
    program traced with 2) fails at run time (0x12); a dynamic scan length alone runs. The carries are written with
    `clone.out`, which resizes its output, and before each stacking the stack is resized (`empty.out`, which keeps
    its memory) to the rows it holds and the step's sizes."""
    from executorch.exir.schema import EValue, Instruction, Int, IntList, KernelCall, Null
    from torch.fx.experimental.symbolic_shapes import free_symbols

    def _emit_scan(self, args, outputs):
        carry_count = len(args[1])
        if not any(free_symbols(value.shape) for value in self.node.meta["val"][:carry_count]):
            return original(self, args, outputs)
        report_applied()
        start = len(self.chain.instructions)
        emitted = original(self, args, outputs)
        carries = {value.id for value in outputs[:carry_count]}
        operator = {name: self._get_operator(name=name, overload=overload)[0] for name, overload in (
            ("aten::copy_", ""), ("aten::clone", "out"), ("aten::sym_size", "int"), ("aten::empty", "out"),
            ("executorch_prim::et_copy_index", "tensor"))}  # fmt: skip
        null = self._emit_evalue(EValue(Null())).id
        instructions = self.chain.instructions[:start]
        for instruction in self.chain.instructions[start:]:
            call = instruction.instr_args
            if isinstance(call, KernelCall) and call.op_index == operator["aten::copy_"] and call.args[0] in carries:
                destination, source = call.args[0], call.args[1]
                call.op_index, call.args = operator["aten::clone"], [source, null, destination, destination]
            elif isinstance(call, KernelCall) and call.op_index == operator["executorch_prim::et_copy_index"]:
                stack, step, row = call.args
                sizes = [row]
                for axis in range(len(self.emitter_state.values[step].val.sizes)):
                    size = self._emit_evalue(EValue(Int(0))).id
                    instructions.append(Instruction(KernelCall(
                        operator["aten::sym_size"], [step, self._emit_evalue(EValue(Int(axis))).id, size])))
                    sizes.append(size)
                shape = self._emit_evalue(EValue(IntList(sizes))).id
                instructions.append(Instruction(KernelCall(operator["aten::empty"], [shape, null, stack, stack])))
            instructions.append(instruction)
        self.chain.instructions[:] = instructions
        return emitted

    return _emit_scan


@register_patch(
    "executorch",
    "executorch.exir.tensor.dim_order_from_stride",
    "executorch.exir.passes.replace_view_copy_with_view_pass.dim_order_from_stride",
    "executorch.exir.emit._emitter.dim_order_from_stride",
    reports=True,
    model_side="upstream change: ExecuTorch's dim_order_from_stride should treat a symbolic stride that is an "
               "exact multiple of the next (e.g. 8*(a+b) against 8, whose `% 8` the shape environment leaves "
               "unresolved) as ordered, e.g. by checking that the quotient simplifies to a polynomial, so "
               "data-dependent sizes don't make strides incomparable.",
)
def _patch_dim_order_of_contiguous_strides(original):
    """ExecuTorch orders a tensor's axes by sorting its strides. Strides holding a data-dependent size (the number
    of image tokens, counted from the input ids) often cannot be compared. When each stride is a multiple of the
    next, the axes are in contiguous order whatever the sizes turn out to be. The shape environment does not see
    every multiple (`8*(a + b) % 8` stays open): a quotient that is a whole expression is one too."""
    import sympy
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode, guard_or_false

    def multiple(outer, inner):
        if guard_or_false(outer % inner == 0):
            return True
        as_expression = [getattr(getattr(size, "node", None), "expr", size) for size in (outer, inner)]
        return sympy.simplify(sympy.sympify(as_expression[0]) / as_expression[1]).is_integer is True

    def dim_order_from_stride(stride):
        try:
            return original(stride)
        except GuardOnDataDependentSymNode:
            if not all(multiple(outer, inner) for outer, inner in zip(stride, stride[1:])):
                raise
            report_applied()
            return tuple(range(len(stride)))

    return dim_order_from_stride


@register_patch(
    "executorch", "executorch.exir.passes.replace_view_copy_with_view_pass._is_view_copy", reports=True,
    upstream="https://github.com/pytorch/executorch/issues/20008",
)
def _patch_views_as_dynamic_as_their_base(original):
    """ExecuTorch turns a `view_copy` into a view sharing its base's memory, and refuses one whose shape is static
    while its base's is dynamic ("_ViewSpec is incompatible with its base on creation"; BLT's patch starts, cut at a
    count read from data, then viewed at the size that count took). Such a view stays a copy."""
    from executorch.exir.tensor import determine_tensor_dynanism

    def is_view_copy(node):
        if not original(node):
            return False
        base_spec = node.args[0].meta.get("spec")
        if base_spec is not None and determine_tensor_dynanism(node.meta["val"].shape) != base_spec.shape_dynamism:
            report_applied()
            return False
        return True

    return is_view_copy


# the most input-size combinations a size's exact upper bound is searched over (an audio length by a batch: ~1e6)
_BOUND_SEARCH_LIMIT = 1 << 22
# A number read from data (a vocoder's frame count, summed from predicted durations; a split's offsets) is planned
# as lying within this many either side of zero, or within its own bound where that is tighter: a decoder attending
# over frames plans their square (FastSpeech2's frames, bounded at 5,000 by its position table, planned 17 GB).
_DATA_DEPENDENT_CEILING = 1024


@register_patch(
    "executorch",
    "executorch.exir.passes.sym_shape_eval_pass.eval_upper_bound",
    "executorch.exir.sym_util.eval_upper_bound",  # what `eval_shape_upper_bound` calls
    reports=True,
    model_side="upstream change: ExecuTorch's eval_upper_bound (sym_util / sym_shape_eval_pass) should bound "
               "size expressions tightly \u2014 treating a repeated symbol as one variable and not dividing the "
               "numerator's top by the denominator's bottom independently \u2014 and fail rather than silently plan "
               "the traced value when no finite bound is found.",
)
def _patch_sizes_bounded_exactly(original):
    """ExecuTorch plans memory for each size's upper bound, found by interval arithmetic over the expression: a
    symbol met twice is bounded as two independent ones, and a quotient takes its numerator's top over its
    denominator's bottom. XLNet's relative shift sizes an axis `length**2 // length`, bounded so at 130,560 where
    it is at most 511: its program planned 137 GB (`std::bad_alloc` at load). Over few enough input sizes, the
    expression's largest value is found exactly.

    A size that depends on a number read from data with no bound of its own has none ("Cannot evaluate a finite
    upper bound"); that number is taken within `_DATA_DEPENDENT_CEILING` either side of zero (or its own bound,
    where tighter), and past it the runtime refuses to resize the tensor.

    Where interval arithmetic finds no finite bound but the size has a traced value, ExecuTorch plans that value
    silently: Swin2SR's window reverse (`height // (height // window)`, a quotient by a floor that may be 0) was
    planned for the traced batch, and a batch of 3 ran out of room ("Attempted to resize a bounded tensor")."""
    import numpy
    import sympy
    from torch.utils._sympy.numbers import int_oo
    from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

    largest = {}  # (expression, ranges) -> its largest value, or None where it cannot be found

    def search(expr, symbols, spans):
        if not symbols or any(span.upper is int_oo or span.lower is -int_oo for span in spans):
            return None
        axes = [numpy.arange(int(span.lower), int(span.upper) + 1) for span in spans]
        if not 0 < math.prod(len(axis) for axis in axes) <= _BOUND_SEARCH_LIMIT:  # 0: a range with no value
            return None
        functions = {"FloorDiv": numpy.floor_divide, "PythonMod": numpy.mod, "Max": numpy.maximum,
                     "Min": numpy.minimum}
        try:
            values = sympy.lambdify(symbols, expr, modules=[functions, "numpy"])(*numpy.meshgrid(*axes))
        except (NameError, TypeError, ValueError, ZeroDivisionError):  # a function with no numpy form
            return None
        return int(numpy.max(values))

    def planned(symbol, span):
        if span is None or not str(symbol).startswith("u"):  # an input size (s0...) keeps its range
            return span
        lower = span.lower if isinstance(span.lower, sympy.Integer) else -_DATA_DEPENDENT_CEILING
        ceiling = max(lower, _DATA_DEPENDENT_CEILING)
        bounded = isinstance(span.upper, sympy.Integer) and span.upper < sys.maxsize - 1  # int64's top: no bound
        return ValueRanges(lower, min(span.upper, ceiling) if bounded else ceiling)

    def find_largest(expr, symbols, spans):
        exact = search(expr, symbols, spans)
        if exact is not None:
            return exact
        upper = bound_sympy(expr, dict(zip(symbols, spans))).upper
        return int(upper) if isinstance(upper, sympy.Integer) else None

    def eval_upper_bound(size):
        if isinstance(size, int):
            return size
        bound, unbounded = None, None
        try:
            bound = original(size)
        except RuntimeError as error:  # no finite bound, nor a traced value
            unbounded = error
        shape_env = size.node.shape_env
        original_expr, ranges = size.node.expr, shape_env.var_to_range
        expr = _counts_at_their_ceilings(original_expr, shape_env)
        symbols = sorted(expr.free_symbols, key=str)
        spans = tuple(planned(symbol, ranges.get(symbol)) for symbol in symbols)
        if None not in spans:
            key = (expr, spans)
            if key not in largest:
                largest[key] = find_largest(expr, symbols, spans)
            found = largest[key]
            # where interval arithmetic finds no bound, the original's number is the traced size, no bound
            if found is not None and (bound is None or found < bound
                                      or not isinstance(bound_sympy(original_expr, ranges).upper, sympy.Integer)):
                report_applied()
                return found
        if unbounded is not None:
            raise unbounded
        return bound

    return eval_upper_bound


def _counts_at_their_ceilings(expr, shape_env):
    """``expr`` with each number read from data that has a known ceiling (a fact ``u <= c`` of the shape
    environment, ``c`` of input sizes only) replaced by it, where ``expr`` does not shrink as the number grows: the
    largest value over the inputs' sizes is then an upper bound that keeps the tie between the count and the sizes
    (VideoMAE's visible tokens per sample, `count // batch`, at most the patches per sample, not the whole batch's
    count over a batch of 2)."""
    import sympy

    for symbol in sorted(expr.free_symbols, key=str):
        if not str(symbol).startswith("u"):
            continue
        for fact in shape_env.deferred_runtime_asserts.get(symbol, ()):
            relation = fact.expr
            if isinstance(relation, sympy.GreaterThan):
                relation = sympy.Le(relation.rhs, relation.lhs, evaluate=False)
            if not isinstance(relation, sympy.LessThan) or relation.lhs != symbol:
                continue
            ceiling = relation.rhs
            if ceiling.free_symbols and all(str(free).startswith("s") for free in ceiling.free_symbols):
                if _nondecreasing(expr, symbol, shape_env):
                    expr = expr.xreplace({symbol: ceiling})
                break
    return expr


def _nondecreasing(expr, symbol, shape_env) -> bool:
    """Whether ``expr`` cannot shrink as ``symbol`` grows, told from its form alone (sums, products of nonnegative
    terms, floor divisions by a positive divisor, maxima and minima). False when unsure."""
    import sympy

    if symbol not in expr.free_symbols:
        return True
    if expr == symbol:
        return True

    def nonnegative(term):
        return shape_env.bound_sympy(term).lower >= 0

    name = type(expr).__name__
    if isinstance(expr, sympy.Add) or name in ("Max", "Min"):
        return all(_nondecreasing(term, symbol, shape_env) for term in expr.args)
    if isinstance(expr, sympy.Mul):
        return all(nonnegative(term) and _nondecreasing(term, symbol, shape_env) for term in expr.args)
    if name == "FloorDiv":
        numerator, divisor = expr.args
        return symbol not in divisor.free_symbols and shape_env.bound_sympy(divisor).lower > 0 and (
            _nondecreasing(numerator, symbol, shape_env))
    if isinstance(expr, sympy.Pow):
        base, exponent = expr.args
        return exponent.is_Integer and exponent > 0 and nonnegative(base) and _nondecreasing(base, symbol, shape_env)
    return False


@register_patch(
    "executorch", "executorch.exir.passes.sym_shape_eval_pass.ConstraintBasedSymShapeEvalPass.call", reports=True,
    model_side="upstream change: torch's fake kernels for masked_select/nonzero (or ExecuTorch's "
               "ConstraintBasedSymShapeEvalPass) should bound the selected-element count by the mask's own "
               "element count (count <= mask.numel()), not by the largest mask alone, so memory planning does "
               "not size the count to the global maximum.",
)
def _patch_counts_of_selected_elements_at_most_their_number(original):
    """A boolean mask's selection (`x[mask]`, `nonzero`) counts at most the mask's elements, yet the trace bounds the
    count by the largest mask alone, not by the mask's own size: the count is tied to the batch no more. Before
    ExecuTorch plans memory from sizes' upper bounds, each such count gets the fact ``count <= mask's elements``,
    which the bound search (`_counts_at_their_ceilings`) uses. VideoMAE pre-training, dynamic, planned
    (32, 4, 1024, 1024) attention scores for 32 tokens per sample: 0x21 at load."""
    import sympy

    aten = torch.ops.aten

    def counted(node):  # the mask a node's unknown count counts, or None
        target = getattr(node.target, "_op", node.target)  # an edge operator wraps its ATen one
        if target is aten.nonzero.default:
            return node.args[0]
        if target is aten.index.Tensor:
            masks = [index for index in node.args[1] if isinstance(index, torch.fx.Node)
                     and index.meta["val"].dtype == torch.bool]  # fmt: skip
            return masks[0] if len(node.args[1]) == 1 and len(masks) == 1 else None
        return None

    def call(self, graph_module):
        for module in graph_module.modules():
            if not isinstance(module, torch.fx.GraphModule):
                continue
            for node in module.graph.nodes:
                mask = counted(node) if node.op == "call_function" else None
                value = node.meta.get("val")
                if mask is None or not isinstance(value, torch.Tensor) or not isinstance(value.shape[0], torch.SymInt):
                    continue
                # ExecuTorch's passes may rerun a node without keeping the record of the count it binds
                count, shape_env = value.shape[0].node.expr, value.shape[0].node.shape_env
                if not count.is_symbol or not str(count).startswith("u"):
                    continue
                sizes = [size if isinstance(size, int) else size.node.expr for size in mask.meta["val"].shape]
                at_most = sympy.Le(count, math.prod(sizes))
                if shape_env._maybe_evaluate_static(at_most) is None:
                    shape_env.guard_or_defer_runtime_assert(at_most, "a selection counts at most its mask's elements")
                    report_applied()
        return original(self, graph_module)

    return call


@register_patch(
    "executorch", "torch.export.exported_program._convert_guards_to_code", reports=True,
    model_side="upstream change: torch.export should not render every shape-environment guard to Python code "
               "(_convert_guards_to_code) for each ExportedProgram a backend creates per lowered partition, e.g."
               " by generating the code lazily when .module() needs it.",
)
def _patch_guards_left_unprinted(original):
    """Each partition a backend lowers becomes an ExportedProgram, which prints every guard of the shared shape
    environment as Python, kept only to check the inputs of its `.module()`: the lowered program never runs them. A
    model with many guards prints them all again for each partition (Qwen3.5-MoE, dynamic: `to_edge` 542 s with
    the printing, 456 s without)."""

    from torch.export.exported_program import _get_shape_env

    def convert_guards_to_code(graph_module):
        shape_env = _get_shape_env(graph_module)
        if shape_env is not None and shape_env.guards:
            report_applied()
        return []

    return convert_guards_to_code


@register_patch(
    "executorch", "torch.fx.traceback.NodeSource.__init__",
    upstream="https://github.com/pytorch/pytorch/pull/193051",
)
def _patch_node_history_shared(original):
    """A node made from another records its source with a deep copy of the source's whole history. Every pass of
    `to_edge`, and of each partition XNNPACK lowers, adds a step to every history, so the copies grow with the
    square of the passes (FunnelForMaskedLM, dynamic: `to_edge` 354 s with them, 258 s without, the same program).
    Nothing changes a recorded history, so the new record shares its source's."""

    def __init__(self, node, pass_name="", action=None):
        original(self, None, pass_name, action)
        if node:
            self.node_info = self.NodeInfo(name=node.name, target=str(node.target), graph_id=id(node.graph))
            self.from_node = list(node.meta.get("from_node", ()))

    return __init__


@register_patch(
    "executorch", "executorch.exir.tensor.TensorSpec.from_tensor", reports=True,
    model_side="upstream change: ExecuTorch's TensorSpec.from_tensor (dim-order derivation) should give tensors "
               "of fewer than four axes the contiguous dim order, as its kernels write them, instead of sorting "
               "strides that follow eager's transposed nonzero layout ((1, 0) dim orders, or unsortable "
               "data-dependent strides).",
)
def _patch_contiguous_order_below_four_axes(original):
    """ExecuTorch orders a tensor's axes by sorting its strides, yet below four axes it has no order but the
    contiguous one (channels last needs four), and its kernels write their outputs so. `nonzero`'s [count, rank]
    result is strided like a transposed tensor, as in eager: for a vector ([count, 1]) that gave the dim order
    (1, 0), which the portable kernels that take it next (squeeze, select, slice) refuse ("different dim orders",
    0x12 at run time); for a matrix with an unknown count the strides cannot even be sorted ("Could not guard on
    data-dependent expression", SuperPoint's keypoints). Such tensors get contiguous strides."""
    from executorch.exir.tensor import contiguous_stride_from_shape
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    def from_tensor(cls, tensor, const=False):
        if const or tensor.dim() > 3:
            return original(tensor, const)
        contiguous_order = tuple(range(tensor.dim()))
        try:
            spec = original(tensor, const)
        except GuardOnDataDependentSymNode:
            spec = cls(dtype=tensor.dtype, shape=tensor.shape, layout=tensor.layout, is_sparse=tensor.is_sparse)
            spec.requires_grad, spec.storage, spec.dim_order = tensor.requires_grad, None, None
        if tuple(spec.dim_order or ()) != contiguous_order:
            report_applied()
            spec.stride, spec.dim_order = contiguous_stride_from_shape(spec.shape), contiguous_order
        return spec

    return from_tensor
