"""ExecuTorch stage 4, FX program fixes: whole-program repairs before lowering (finite bounds for dynamic axes and
for counts read from data).
"""

from __future__ import annotations

import math
import operator

import torch

from ..registration import register_fx_program_fix


# ── Stage 4: FX program fixes ────────────────────────────────────────────────
# `@register_fx_program_fix("executorch")`: `fix(exported_program) -> bool`.

# ExecuTorch plans a dynamic axis' memory for its upper bound: an axis may grow to this many times its traced size
# (and at least to the floor), whatever larger bound the model allows (a 5,000-long position table let FastSpeech2
# plan 17 GB for a tiny model).
_DYNAMIC_GROWTH = 4
_DYNAMIC_FLOOR = 32


@register_fx_program_fix(
    "executorch",
    upstream="https://github.com/pytorch/executorch/issues/8766",
    model_side="upstream change: ExecuTorch's memory planning should allocate a dynamic axis at run time (or refuse"
               " one with no finite upper bound) instead of planning its largest size, or its traced size when it"
               " has none.",
)
def _fix_dynamic_axes_bounded_for_planning(exported_program) -> bool:
    """ExecuTorch plans memory for each dynamic axis' upper bound, once, for the largest input. An unbounded axis
    gets only its traced size (a longer input does not fit), and a bound the model sets (its position table)
    plans gigabytes: FastSpeech2 Conformer, with sequences up to 5,000, planned 17 GB and peaked at 20.7 GB.

    Bounds every input axis at `_DYNAMIC_GROWTH` times its traced size (at least `_DYNAMIC_FLOOR`), or at the
    model's own bound where it is lower, in both places ExecuTorch reads: the program's range constraints and the
    shape environment's ranges. Narrowing a range keeps the program valid: its guards held over the wider one.
    """
    from torch.utils._sympy.value_ranges import ValueRanges

    shape_env = next(
        (
            node.meta["val"].fake_mode.shape_env
            for node in exported_program.graph.nodes
            if isinstance(node.meta.get("val"), torch.Tensor) and getattr(node.meta["val"], "fake_mode", None)
        ),
        None,
    )
    traced_sizes = shape_env.backed_var_to_val if shape_env is not None else {}
    changed = False
    for ranges in (exported_program.range_constraints, shape_env.var_to_range if shape_env else {}):
        for symbol, bounds in list(ranges.items()):
            # only input axes (backed symbols, s0...): a data-dependent size (u0...) has no traced value to grow from
            if str(symbol).startswith("u"):
                continue
            # a key may be an expression of symbols: X-Codec 2's samples, 320 per frame of its features (320*s37)
            traced = symbol.xreplace(traced_sizes)
            traced = int(traced) if traced.is_number and traced.is_finite else 2
            lower = bounds.lower if bounds.lower.is_finite else 0
            planned = max(traced * _DYNAMIC_GROWTH, _DYNAMIC_FLOOR, lower)
            if bounds.upper <= planned:
                continue
            ranges[symbol] = ValueRanges(lower, planned)
            changed = True
    return changed


def _count_ceiling(node):
    """The largest value a count of booleans can take (their sum over some axes, or the largest or smallest of such
    sums): the number of elements summed, in the input's sizes (symbols where they are dynamic). None for a tensor
    that is no such count."""
    aten = torch.ops.aten
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return None
    source = node.args[0]
    if node.target in (aten.max.default, aten.amax.default, aten.min.default, aten.amin.default):
        return _count_ceiling(source)
    if node.target not in (aten.sum.dim_IntList, aten.sum.default):
        return None
    each = 1 if source.meta["val"].dtype == torch.bool else _count_ceiling(source)
    shape = source.meta["val"].shape
    axes = node.args[1] if node.target is aten.sum.dim_IntList and node.args[1] else range(len(shape))
    sizes = [shape[axis] if isinstance(shape[axis], int) else shape[axis].node.expr for axis in axes]
    return None if each is None else each * math.prod(sizes)


def _position_ceiling(node):
    """The largest value a coordinate found by `nonzero` can take: its axis' size less one. `node` picks one such
    coordinate from `nonzero`'s (count, axes) output, by a row then a column. None for anything else."""
    aten = torch.ops.aten
    column = None
    while isinstance(node, torch.fx.Node) and node.op == "call_function":
        if node.target is aten.nonzero.default:
            if column is None:
                return None
            size = node.args[0].meta["val"].shape[column]
            return (size if isinstance(size, int) else size.node.expr) - 1
        if node.target is operator.getitem and node.args[0].target is aten.unbind.int and column is None:
            unbound, column = node.args[0], node.args[1]
            if unbound.args[1:] not in ((), (0,)) or unbound.args[0].meta["val"].dim() != 1:
                return None
            node = unbound.args[0]
        elif node.target is aten.select.int and node.args[1] == 0:
            if node.args[0].meta["val"].dim() == 1 and column is None:
                column = node.args[2]
            elif node.args[0].meta["val"].dim() != 2 or column is None:
                return None
            node = node.args[0]
        else:
            return None
    return None


@register_fx_program_fix(
    "executorch",
    upstream="https://github.com/pytorch/executorch/issues/7998",
)
def _fix_counts_read_from_data_bounded(exported_program) -> bool:
    """A number read from data has no known range, and to_edge's slice decomposition asks whether a slice's end is
    negative (counted from the back) or past the axis: "Could not guard on data-dependent expression u22 < 0", or
    "u22 > s69 - 1" on a dynamic axis; and a `select` at such a number whether it is inside the axis. BLT cuts its
    patch starts at the largest count of entropy peaks: a count of booleans, between 0 and the number of them
    counted. ESMFold reads its best alignment's score at the coordinates `nonzero` finds: between 0 and the axis'
    size less one. Such numbers get that range in the shape environment, and where the ceiling is symbolic, the
    fact that they do not exceed it."""
    import sympy
    from torch.utils._sympy.value_ranges import ValueRanges

    reads = (torch.ops.aten.item.default, torch.ops.aten._local_scalar_dense.default)
    changed = False
    for node in exported_program.graph.nodes:
        value = node.meta.get("val")
        if node.target not in reads or not isinstance(value, torch.SymInt) or not value.node.expr.is_symbol:
            continue
        ceiling = _count_ceiling(node.args[0])
        ceiling = _position_ceiling(node.args[0]) if ceiling is None else ceiling
        shape_env, count = value.node.shape_env, value.node.expr
        bounds = shape_env.var_to_range.get(count)
        if ceiling is None or bounds is None:
            continue
        ceiling = sympy.sympify(ceiling)
        narrowed = bounds & ValueRanges(0, shape_env.bound_sympy(ceiling).upper)
        if narrowed != bounds:
            shape_env.var_to_range[count] = narrowed
            changed = True
        at_most = sympy.Le(count, ceiling)
        if ceiling.free_symbols and shape_env._maybe_evaluate_static(at_most) is None:
            # true of every count; the shape environment takes facts about unknown numbers as runtime asserts
            shape_env.guard_or_defer_runtime_assert(at_most, "a count of booleans is at most their number")
            changed = True
    return changed


@register_fx_program_fix(
    "executorch",
    model_side="upstream change: to_edge's re-trace should not rebind an unbacked slice-length symbol to the "
               "count it equals (failing with 'possible memo disaster'); torch.export should give x[:, :count] "
               "the count itself as its length once count <= width is known.",
)
def _fix_slices_to_a_count_as_long_as_it(exported_program) -> bool:
    """The trace gave ``x[:, :count]`` a fresh unknown length: it could not tell the count from the width. Once
    the count is known not to exceed the width (above), a retrace finds the count itself as that length, and
    to_edge's rebinding of the old symbol to it fails on the next retrace ("u2 possible memo disaster"; BLT's
    patch starts on a dynamic axis). The length is made the count for good; the slice binds no symbol of its own."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    changed = False
    for node in exported_program.graph.nodes:
        if node.target is not torch.ops.aten.slice.Tensor or len(node.args) < 4 or node.args[2] not in (None, 0):
            continue
        count_node = node.args[3]
        count = getattr(count_node, "meta", {}).get("val")
        if not isinstance(count, torch.SymInt) or node.args[4:] not in ((), (1,)):
            continue
        source, dim = node.args[0].meta["val"], node.args[1]
        length = node.meta["val"].shape[dim]
        bindings = node.meta.get("unbacked_bindings") or {}
        if not isinstance(length, torch.SymInt) or set(bindings) != {length.node.expr}:
            continue
        if statically_known_true(count <= source.shape[dim]) and statically_known_true(count >= 0):
            count.node.shape_env._set_replacement(length.node.expr, count.node.expr, "a slice up to a count")
            del node.meta["unbacked_bindings"]
            changed = True
    return changed
