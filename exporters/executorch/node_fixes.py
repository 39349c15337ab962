"""ExecuTorch stage 5, FX node fixes: one node at a time, patterns the ExecuTorch backends or runtime cannot take
rewritten into ones they can.
"""

from __future__ import annotations

import functools
import math
import operator
import sys

import torch

from ..registration import register_fx_node_fix
from ..rewrites import contiguous_copy


# ── Stage 5: FX node fixes ───────────────────────────────────────────────────
# `@register_fx_node_fix("executorch")`: `fix(graph_module, node) -> bool`.


@register_fx_node_fix(
    "executorch",
    upstream="https://github.com/pytorch/pytorch/issues/136543",
)
def _fix_attention_output_layout(graph_module, node) -> bool:
    """The trace takes SDPA's output strides from its fake kernel; to_edge's SDPA decomposition returns other
    strides, and a `view` the trace recorded downstream no longer fits ("Cannot view a tensor with shape [2, 7, 32]
    and strides (32, 64, 1)"; GPT-2's projection after attention). A contiguous copy of the output fixes its
    layout before anything is recorded on it, and the `view`s after it become `reshape`s (they copy only if they
    must; the graph is functional, nothing relies on the alias)."""
    if node.op != "call_function" or node.target is not torch.ops.aten.scaled_dot_product_attention.default:
        return False
    if any(user.target is torch.ops.aten.clone.default for user in node.users):
        return False
    with graph_module.graph.inserting_after(node):
        copy = contiguous_copy(graph_module.graph, node)
    _move_users_to(node, copy)
    pending = list(copy.users)
    while pending:  # the views recorded on the old layout
        user = pending.pop()
        if user.target is torch.ops.aten.view.default:
            user.target = torch.ops.aten.reshape.default
        if user.target in (torch.ops.aten.view.default, torch.ops.aten.reshape.default, torch.ops.aten.transpose.int,
                           torch.ops.aten.permute.default):  # fmt: skip
            pending.extend(user.users)
    return True


def _call(graph, target, *args, **kwargs):
    """A node ``target(*args, **kwargs)`` at the graph's insertion point, with its fake value."""
    node = graph.call_function(target, args, kwargs)
    node.meta["val"] = target(*torch.fx.node.map_arg(args, lambda arg: arg.meta["val"]), **kwargs)
    return node


def _call_after(graph, anchor, target, *args, after=None, **kwargs):
    """A node ``target(anchor, *args, **kwargs)`` right after ``after`` (by default ``anchor``), with its fake value.
    The anchor may be a list of nodes (a concatenation's), given ``after``."""
    with graph.inserting_after(after or anchor):
        return _call(graph, target, anchor, *args, **kwargs)


def _move_users_to(node, replacement) -> None:
    """Every user of ``node`` but ``replacement`` reads ``replacement`` instead. ``replacement`` must be the only new
    node that reads ``node``: another would be moved too (the remainder fixes keep their users' list instead)."""
    node.replace_all_uses_with(replacement, delete_user_cb=lambda user: user is not replacement)


def _refresh_value(node) -> None:
    """``node``'s fake value computed again from its arguments, after they changed."""
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda arg: arg.meta["val"])
    node.meta["val"] = node.target(*args, **kwargs)


# argument names of the convolutions a program may hold, in order
_CONVOLUTIONS = {
    torch.ops.aten.conv3d.default: ("input", "weight", "bias", "stride", "padding", "dilation", "groups"),
    torch.ops.aten.convolution.default: (
        "input", "weight", "bias", "stride", "padding", "dilation", "transposed", "output_padding", "groups"
    ),
}


@register_fx_node_fix(
    "executorch",
    upstream="https://github.com/pytorch/executorch/issues/11704",
)
def _fix_patchify_conv3d(graph_module, node) -> bool:
    """Video and Qwen-VL patch embeddings are a 3-D convolution whose stride is its kernel (tubelets, or patches
    cut beforehand). ExecuTorch's portable convolution takes only 3-D and 4-D inputs and XNNPACK has no 3-D one:
    the same products are a linear layer over the flattened patches, which XNNPACK lowers."""
    if node.op != "call_function" or node.target not in _CONVOLUTIONS:
        return False
    options = {"bias": None, "stride": [1], "padding": [0], "dilation": [1], "transposed": False, "groups": 1}
    options.update(zip(_CONVOLUTIONS[node.target], node.args), **node.kwargs)
    source, weight, bias = options["input"], options["weight"], options["bias"]
    kernel = list(weight.meta["val"].shape[2:])
    spatial = list(source.meta["val"].shape[2:])
    stride = list(options["stride"]) * (3 if len(options["stride"]) == 1 else 1)
    plain = not options["transposed"] and options["groups"] == 1 and set(options["dilation"]) == {1}
    if len(kernel) != 3 or not plain or options["padding"] not in ([0], [0, 0, 0], (0, 0, 0)) or stride != kernel:
        return False
    if not all(isinstance(size, int) for size in spatial):
        return False
    out_channels, in_channels = weight.meta["val"].shape[:2]
    grid = [s // k for s, k in zip(spatial, kernel)]
    graph, aten = graph_module.graph, torch.ops.aten
    patches, first = source, node.prev  # the chain starts right before the convolution, after every input
    for axis, (size, k) in enumerate(zip(spatial, kernel)):
        if size % k:  # the convolution leaves out what no whole patch covers
            patches = _call_after(graph, patches, aten.slice.Tensor, axis + 2, 0, size - size % k, after=first)
            with graph.inserting_after(patches):
                patches = first = contiguous_copy(graph, patches)
    spatial = [g * k for g, k in zip(grid, kernel)]
    # Fold one axis at a time (XNNPACK takes at most 6 dims): rows end up (batch, depth, height, width) patches,
    # columns (channel, depth, height, width) within one, as the weight's.
    for axis, rest in ((0, [spatial[1] * spatial[2]]), (1, [spatial[2]]), (2, [])):
        folded = in_channels * math.prod(kernel[:axis])
        patches = _call_after(graph, patches, aten.view.default, [-1, folded, grid[axis], kernel[axis], *rest],
                              after=first)
        first = None
        patches = _call_after(graph, patches, aten.transpose.int, 1, 2)
        with graph.inserting_after(patches):
            patches = contiguous_copy(graph, patches)
    patches = _call_after(graph, patches, aten.view.default, [-1, in_channels * math.prod(kernel)])
    flat_weight = _call_after(graph, weight, aten.view.default, [out_channels, -1], after=patches)
    embedded = _call_after(graph, patches, aten.linear.default, flat_weight, bias, after=flat_weight)
    embedded = _call_after(graph, embedded, aten.view.default, [-1, *grid, out_channels])
    embedded = _call_after(graph, embedded, aten.permute.default, [0, 4, 1, 2, 3])
    node.replace_all_uses_with(embedded)
    graph.erase_node(node)
    return True


@register_fx_node_fix(
    "executorch",
    model_side="upstream change: the ExecuTorch XNNPACK partitioner (MaxDimConfig) should only claim max.dim "
               "when its lowering can handle it (dims 2/3 with keepdim on 4-D), and the lowered max feeding a "
               "softmax must match eager, instead of taking any 4-D max.dim and then failing ('amax.default only"
               " supports dim == 2 or dim == 3') or producing wrong values.",
)
def _fix_max_for_xnnpack(graph_module, node) -> bool:
    """XNNPACK's partitioner takes `max.dim` on any 4-D input; its lowering accepts only the dims 2 and 3 with the
    reduced axis kept ("amax.default only supports dim == 2 or dim == 3": GPT-OSS's attention sinks over
    `dim=-1`, Hiera's pooling over axis 1), and a max it does lower, followed by a softmax, comes out wrong (GPT-OSS
    logits off by 0.2). A 5-D max it leaves to the portable kernel: the input gains a leading axis of one, which
    each output drops again. Other ranks only get their axis counted from the front."""
    if node.op != "call_function" or node.target is not torch.ops.aten.max.dim:
        return False
    source, dim, *rest = node.args
    rank = source.meta["val"].dim()
    axis = dim % rank
    if rank != 4:
        node.args = (source, axis, *rest)
        return dim != axis
    _widen_by_a_leading_axis(graph_module.graph, node, axis + 1, *rest)
    return True


def _widen_by_a_leading_axis(graph, node, *args) -> None:
    """``node`` called as ``node.target(input, *args)`` on its input with a leading axis of one, which each of its
    outputs (one tensor, or a tuple read by `getitem`) drops again."""
    widened = _call_after(graph, node.args[0], torch.ops.aten.unsqueeze.default, 0, after=node.prev)
    node.args = (widened, *args)
    _refresh_value(node)
    if isinstance(node.meta["val"], torch.Tensor):
        outputs = [node]
    else:
        outputs = list(node.users)
        for output in outputs:
            output.meta["val"] = node.meta["val"][output.args[1]]
    for output in outputs:
        _move_users_to(output, _call_after(graph, output, torch.ops.aten.squeeze.dim, 0))


@register_fx_node_fix(
    "executorch",
    model_side="upstream change: the SIMD path of ExecuTorch's optimized native_layer_norm kernel (rows of 256 "
               "elements or more; shorter rows take the scalar path of pytorch/executorch#18636) should return "
               "eager's values for float16 and bfloat16 inputs, as that scalar path does, instead of values off "
               "by several units.",
)
def _fix_half_layer_norm_in_float32(graph_module, node) -> bool:
    """ExecuTorch's optimized layer norm is wrong in half precision on rows of 256 elements or more: its SIMD path
    returns values off by 2 to 5 (random rows, weight one) where shorter rows, and float32, match eager. Swin V2's
    last stages (256 channels) came out 419 off float32 eager, where half eager is 0.029 off. Eager computes a half
    layer norm's moments in float32, so the norm runs in float32 here too, between casts of its input and
    parameters and a cast of its output back."""
    if node.op != "call_function" or node.target is not torch.ops.aten.layer_norm.default:
        return False
    dtype = node.args[0].meta["val"].dtype
    if dtype not in (torch.float16, torch.bfloat16):
        return False
    graph = graph_module.graph

    def in_float32(arg):  # the input, and the weight and bias where they are half too (not a symbolic size)
        value = arg.meta["val"]
        if not isinstance(value, torch.Tensor) or value.dtype == torch.float32:
            return arg
        return _call(graph, torch.ops.aten._to_copy.default, arg, dtype=torch.float32)

    with graph.inserting_before(node):
        node.args = torch.fx.node.map_arg(node.args, in_float32)
        node.kwargs = torch.fx.node.map_arg(node.kwargs, in_float32)
    _refresh_value(node)
    _move_users_to(node, _call_after(graph, node, torch.ops.aten._to_copy.default, dtype=dtype))
    return True


@register_fx_node_fix(
    "executorch",
    model_side="upstream change: the ExecuTorch XNNPACK partitioner should not claim a 2-D max pool on an "
               "unbatched (C, H, W) input, or its channels-last pass should add the batch axis itself, instead "
               "of failing with 'Attempting to convert non-NHWC compatible node to NHWC'.",
)
def _fix_unbatched_pool_for_xnnpack(graph_module, node) -> bool:
    """A 2-D max pool of an unbatched (channels, height, width) input: XNNPACK's partitioner takes it, and its
    channels-last pass, which needs a batch axis, refuses it ("Attempting to convert non-NHWC compatible node to
    NHWC"; SuperPoint's non-maximum suppression pools its score maps so). The input gains a batch of one."""
    if node.op != "call_function" or node.target is not torch.ops.aten.max_pool2d.default:
        return False
    if node.args[0].meta["val"].dim() != 3:
        return False
    _widen_by_a_leading_axis(graph_module.graph, node, *node.args[1:])
    return True


@register_fx_node_fix(
    "executorch",
    model_side="upstream change: the ExecuTorch XNNPACK partitioner should only claim prelu on 4-D inputs (or "
               "its channels-last pass should reshape 2-D/3-D inputs), instead of failing with 'Attempting to "
               "convert non-NHWC compatible node to NHWC'.",
)
def _fix_prelu_for_xnnpack(graph_module, node) -> bool:
    """XNNPACK's partitioner takes `prelu` of any rank but lowers it channels-last, which only a 4-D input has
    ("Attempting to convert non-NHWC compatible node to NHWC": DAB-DETR's PReLU after a linear, on 3-D tokens). A
    2-D or 3-D input gains trailing axes of one, which the output drops again; the channels stay on axis 1."""
    if node.op != "call_function" or node.target is not torch.ops.aten.prelu.default:
        return False
    source = node.args[0]
    rank = source.meta["val"].dim()
    if rank not in (2, 3):
        return False
    graph = graph_module.graph
    widened = source
    for axis in range(rank, 4):
        widened = _call_after(graph, widened, torch.ops.aten.unsqueeze.default, axis, after=node.prev)
    node.args = (widened, *node.args[1:])
    _refresh_value(node)
    _move_users_to(node, _call_after(graph, node, torch.ops.aten.squeeze.dims, list(range(rank, 4))))
    return True


@register_fx_node_fix(
    "executorch",
    model_side="upstream change: ExecuTorch's portable constant_pad_nd kernel should support negative padding "
               "(cropping), as aten does, instead of rejecting it ('Padding values must be non-negative').",
)
def _fix_negative_padding_as_slice(graph_module, node) -> bool:
    """A negative pad crops, which the portable `constant_pad_nd` kernel refuses at run time ("Padding values must
    be non-negative"; RWKV's time shift pads one step in front and drops the last). The crops become slices, and
    what remains pads."""
    aten = torch.ops.aten
    if node.op != "call_function" or node.target not in (aten.constant_pad_nd.default, aten.pad.default):
        return False
    source, pad, *value = node.args
    if node.target is aten.pad.default:  # pad(input, pad, mode="constant", value=None)
        mode = value[0] if value else node.kwargs.get("mode", "constant")
        fill = value[1] if len(value) > 1 else node.kwargs.get("value")
        if mode != "constant":
            return False
        value = [] if fill is None else [fill]
    if not any(isinstance(amount, int) and amount < 0 for amount in pad):
        return False
    cropped = source
    for index in range(0, len(pad), 2):  # pairs (before, after) from the last axis backwards
        before, after = pad[index], pad[index + 1]
        if before < 0 or after < 0:
            dim = -(index // 2) - 1
            cropped = _call_after(graph_module.graph, cropped, aten.slice.Tensor, dim, max(-before, 0),
                                  after if after < 0 else sys.maxsize)
    node.target, node.kwargs = aten.constant_pad_nd.default, {}
    node.args = (cropped, [max(amount, 0) for amount in pad], *value)
    return True


@register_fx_node_fix(
    "executorch",
    model_side="VideoMAEDecoder.forward should take its last return_token_num tokens as hidden_states[:, "
               "hidden_states.shape[1] - return_token_num:] instead of hidden_states[:, -return_token_num:], so "
               "the data-dependent slice start is not negative.",
)
def _fix_tail_slice_of_a_count_from_the_front(graph_module, node) -> bool:
    """`x[:, -count:]` with a count read from data (VideoMAE's decoder keeps the last `masked` tokens) starts at
    `-count`, and to_edge's slice decomposition asks whether that start is negative: "Could not guard on
    data-dependent expression -((u37//2)) < 0". The same tail starts at `size - count`, which is not. Only a count
    of 0 tells them apart (all tokens or none), and eager fails on it: nothing masked, nothing to reconstruct."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols, statically_known_true

    aten = torch.ops.aten
    if node.op != "call_function" or node.target is not aten.slice.Tensor or len(node.args) < 3:
        return False
    source, dim, start = node.args[:3]
    from_back = getattr(start, "meta", {}).get("val")
    if not isinstance(from_back, torch.SymInt) or not free_unbacked_symbols(from_back):
        return False
    if statically_known_true(from_back >= 0) or not statically_known_true(from_back <= 0):
        return False
    with graph_module.graph.inserting_before(node):
        size = _call(graph_module.graph, aten.sym_size.int, source, dim)
        from_front = _call(graph_module.graph, operator.add, size, start)
    node.args = (source, dim, from_front, *node.args[3:])
    node.meta.pop("unbacked_bindings", None)  # the length follows from the new start: no fresh number to bind
    return True


@register_fx_node_fix(
    "executorch",
    model_side="upstream change: ExecuTorch's memory-format pass should keep the symbolic sizes of the `empty` "
               "that torch's circular-padding decomposition fills (its _empty_dim_order takes int[] not "
               "SymInt[]), so a circularly padded convolution keeps its dynamic batch.",
)
def _fix_circular_padding_as_concatenation(graph_module, node) -> bool:
    """to_edge decomposes circular padding into an `empty` it fills, and the memory-format pass pins that `empty`'s
    symbolic sizes (Informer's token convolution pads circularly: its batch came out fixed). Wrapping around is
    the tensor between its last and first slices, one axis at a time."""
    aten = torch.ops.aten
    if node.op != "call_function" or node.target is not aten.pad.default:
        return False
    source, pad = node.args[:2]
    mode = node.args[2] if len(node.args) > 2 else node.kwargs.get("mode", "constant")
    if mode != "circular" or not all(isinstance(amount, int) and amount >= 0 for amount in pad):
        return False
    graph, padded = graph_module.graph, source
    for index in range(0, len(pad), 2):  # pairs (before, after) from the last axis backwards
        before, after = pad[index], pad[index + 1]
        dim = source.meta["val"].dim() - index // 2 - 1
        last = _call_after(graph, padded, aten.slice.Tensor, dim, -before, sys.maxsize) if before else None
        first = _call_after(graph, padded, aten.slice.Tensor, dim, 0, after, after=last) if after else None
        parts = [part for part in (last, padded, first) if part is not None]
        if len(parts) > 1:
            padded = _call_after(graph, parts, aten.cat.default, dim, after=first or last)
    node.replace_all_uses_with(padded)
    graph.erase_node(node)
    return True


_INDEXED_SCATTERS = (torch.ops.aten.scatter_add.default, torch.ops.aten.scatter_add_.default)


@register_fx_node_fix(
    "executorch",
    model_side="upstream change: ExecuTorch's edge dialect (and portable scatter kernels) should accept an int32"
               " index for scatter ops, as aten does, instead of rejecting the program with 'mismatched dtypes'.",
)
def _fix_scatter_index_as_int64(graph_module, node) -> bool:
    """ExecuTorch's edge dialect takes a scatter's index as int64 only and rejects the program otherwise ("mismatched
    dtypes"); GLM-5 Next counts its selected keys by an int32 index. The same index, widened."""
    if node.op != "call_function" or node.target not in _INDEXED_SCATTERS:
        return False
    index = node.args[2]
    if not isinstance(index, torch.fx.Node) or index.meta["val"].dtype != torch.int32:
        return False
    node.replace_input_with(index, _call_after(graph_module.graph, index, torch.ops.aten.to.dtype, torch.int64))
    return True


@register_fx_node_fix(
    "executorch",
    model_side="upstream change: ExecuTorch should plan an alias/alias_copy output in its input's dim order (or "
               "emit a dim-order-converting copy) instead of the default order, so a copy after a channels-last "
               "kernel doesn't fail with '2 input tensors have different dim orders'.",
)
def _fix_alias_as_its_input(graph_module, node) -> bool:
    """A slice that keeps everything traces as `alias`, which ExecuTorch runs as a copy whose output it plans in the
    default dim order: when the input comes from a channels-last kernel, the copy refuses the mismatch at run time
    ("2 input tensors have different dim orders"; Swin2SR crops its upscaled image to the size it already has).
    The value is its input's."""
    if node.op != "call_function" or node.target is not torch.ops.aten.alias.default:
        return False
    source = node.args[0]
    if not isinstance(source, torch.fx.Node) or source.op == "placeholder":
        return False  # a program input returned as is stays a distinct value
    if any(user.op == "output" for user in source.users):
        return False  # and so does an output returned twice
    node.replace_all_uses_with(source)
    graph_module.graph.erase_node(node)
    return True


@register_fx_node_fix(
    "executorch",
    model_side="upstream change: ExecuTorch should plan a slice_copy of a channels-last tensor in its input's "
               "dim order (as eager's view keeps it), or have the portable slice_copy kernel convert dim orders,"
               " instead of planning it contiguous and failing tensors_have_same_dim_order (0x12).",
)
def _fix_slice_of_channels_last_from_a_contiguous_copy(graph_module, node) -> bool:
    """A slice of a channels-last tensor (a convolution's output over permuted tokens) is a view in eager; ExecuTorch
    runs it as `slice_copy`, whose output it plans contiguous, and its kernel refuses to copy between dim orders
    ("tensors_have_same_dim_order", 0x12; Swin2SR crops its upscaled image at a symbolic size). The slice reads a
    contiguous copy, which ExecuTorch makes with a kernel that converts dim orders."""
    from torch.fx.experimental.symbolic_shapes import guard_or_false

    if node.op != "call_function" or node.target is not torch.ops.aten.slice.Tensor:
        return False
    source = node.args[0]
    value = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or value.dim() != 4 or guard_or_false(value.is_contiguous()):
        return False
    if not guard_or_false(value.is_contiguous(memory_format=torch.channels_last)):
        return False
    with graph_module.graph.inserting_before(node):
        copy = contiguous_copy(graph_module.graph, source)
    node.replace_input_with(source, copy)
    return True


def _has_no_elements(node) -> bool:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return value is not None and any(isinstance(size, int) and size == 0 for size in value.shape)


@register_fx_node_fix(
    "executorch",
    model_side="upstream change: ExecuTorch's portable cat kernel should add up the lengths of every input of full "
               "rank, empty ones included (skipping only the legacy 1-D empty tensors), and PruneEmptyTensorsPass "
               "should size the `full` it puts for a cat of empty inputs from graph nodes when the size is "
               "symbolic (the emitter refuses symbolic sizes: 'Unsupported type encountered in int list').",
)
def _fix_empty_cat_as_zeros_of_its_size(graph_module, node) -> bool:
    """A concatenation of tensors of no elements, of a symbolic size: Mistral Large 4's cache of zero width for its
    layers without rope, grown by each step's. The runtime's `cat` adds up the lengths of the inputs that have
    elements only, so the cache lost its length (eager (3, 1, 9, 0), the program (3, 1, 0, 0)) and the next step's
    copy refused it (0x12); and the lowering's own replacement writes the size as values, which a symbolic size is
    not. It is zeros of its size, each symbolic size read from the inputs: along the cat, their sum; across it, the
    first's. The legacy 1-D empty tensors `cat` passes over add nothing."""
    if node.op != "call_function" or node.target is not torch.ops.aten.cat.default:
        return False
    tensors, shape = node.args[0], node.meta["val"].shape
    if not all(_has_no_elements(tensor) for tensor in tensors) or all(isinstance(size, int) for size in shape):
        return False  # static: the lowering writes it as a `full`
    axis = (node.args[1] if len(node.args) > 1 else 0) % len(shape)
    ranked = [tensor for tensor in tensors if tensor.meta["val"].dim() == len(shape)]
    graph = graph_module.graph
    with graph.inserting_before(node):
        sizes = []
        for index, size in enumerate(shape):
            if isinstance(size, int):
                sizes.append(size)
                continue
            lengths = [_call(graph, torch.ops.aten.sym_size.int, tensor, index) for tensor in
                       (ranked if index == axis else ranked[:1])]  # fmt: skip
            sizes.append(functools.reduce(lambda total, length: _call(graph, operator.add, total, length), lengths))
        zeros = _call(graph, torch.ops.aten.new_zeros.default, ranked[0], sizes, dtype=node.meta["val"].dtype)
    node.replace_all_uses_with(zeros)
    graph.erase_node(node)
    return True


@register_fx_node_fix(
    "executorch",
    model_side="upstream change: ExecuTorch should lay out nonzero's [count, rank] output by rows (contiguous "
               "dim order), matching what its kernel writes, instead of deriving a (1, 0) dim order from eager's"
               " transposed strides ('Failed to map a given dim_order').",
)
def _fix_nonzero_laid_out_by_rows(graph_module, node) -> bool:
    """`nonzero` of a matrix or more gives [count, rank] strided like a transposed tensor, as eager does, while the
    runtime's kernel writes it row by row. The strides spread to the ops that read it, and ExecuTorch turns strides
    into dim orders: (1, 0) has no memory format ("Failed to map a given dim_order", SuperPoint's keypoints). A
    contiguous copy follows it, and only its own spec is left to lay out by rows."""
    if node.op != "call_function" or node.target is not torch.ops.aten.nonzero.default:
        return False
    if node.meta["val"].shape[1] < 2:
        return False
    with graph_module.graph.inserting_after(node):
        _move_users_to(node, contiguous_copy(graph_module.graph, node))
    return True


@register_fx_node_fix(
    "executorch",
    model_side="upstream change: ExecuTorch's integer remainder (the portable remainder kernels and the "
               "executorch_prim mod for sizes) should follow torch's floored semantics (result takes the "
               "divisor's sign) instead of C's truncated `%`.",
)
def _fix_integer_remainder_sign(graph_module, node) -> bool:
    """The runtime's integer `remainder` keeps the dividend's sign, as C's `%` does (-1 % 4 gives -1, eager 3):
    EfficientLoFTR places an unmatched keypoint, index -1, a whole image width to the left. Where the remainder
    and the divisor differ in sign, adding the divisor gives the floored one. Its `%` of sizes does the same:
    LongT5 pads its tokens to whole blocks by `-length % block`, got a negative padding, no block at all, and
    divided by that count (SIGFPE); there `(remainder + divisor) % divisor` has the divisor's sign."""
    aten = torch.ops.aten
    if node.op == "call_function" and node.target is operator.mod and isinstance(node.meta.get("val"), torch.SymInt):
        return _floor_size_remainder(graph_module.graph, node)
    if node.op != "call_function" or node.target not in (aten.remainder.Tensor, aten.remainder.Scalar):
        return False
    value, divisor = node.meta.get("val"), node.args[1]
    if value is None or value.dtype.is_floating_point or value.dtype == torch.bool:
        return False
    graph, users = graph_module.graph, list(node.users)
    divisor_value = divisor.meta["val"] if isinstance(divisor, torch.fx.Node) else divisor
    if isinstance(divisor_value, torch.Tensor):
        nonzero = _call_after(graph, node, aten.ne.Scalar, 0)
        signs_differ = _call_after(graph, _call_after(graph, node, aten.lt.Scalar, 0, after=nonzero), aten.ne.Tensor,
                                   _call_after(graph, divisor, aten.lt.Scalar, 0, after=nonzero))
        to_shift = _call_after(graph, nonzero, aten.logical_and.default, signs_differ, after=signs_differ)
        shifted = _call_after(graph, node, aten.add.Tensor, divisor, after=to_shift)
    else:  # a number, or a size the program computes (Mistral 3's patch count // 4)
        from torch.fx.experimental.symbolic_shapes import guard_or_false

        if guard_or_false(divisor_value > 0):
            to_shift = _call_after(graph, node, aten.lt.Scalar, 0)
        elif guard_or_false(divisor_value < 0):
            to_shift = _call_after(graph, node, aten.gt.Scalar, 0)
        else:
            return False
        shifted = _call_after(graph, node, aten.add.Scalar, divisor, after=to_shift)
    floored = _call_after(graph, to_shift, aten.where.self, shifted, node, after=shifted)
    for user in users:
        user.replace_input_with(node, floored)
    return True


def _floor_size_remainder(graph, node) -> bool:
    from torch.fx.experimental.symbolic_shapes import guard_or_false

    dividend, divisor = (arg.meta["val"] if isinstance(arg, torch.fx.Node) else arg for arg in node.args)
    if guard_or_false(dividend >= 0) and guard_or_false(divisor > 0):
        return False  # the same remainder either way
    users = list(node.users)
    with graph.inserting_after(node):
        shifted = graph.call_function(operator.add, (node, node.args[1]))
    shifted.meta["val"] = node.meta["val"] + divisor
    with graph.inserting_after(shifted):
        floored = graph.call_function(operator.mod, (shifted, node.args[1]))
    floored.meta["val"] = node.meta["val"]
    for user in users:
        user.replace_input_with(node, floored)
    return True


_CONJUGATES = (torch.ops.aten._conj.default, torch.ops.aten.conj.default, torch.ops.aten.conj_physical.default)


def _fft_arguments(node) -> tuple:
    """``(input, n, dim, norm)`` of an `fft_rfft` or `fft_irfft` node, defaults filled in."""
    named = dict(zip(("self", "n", "dim", "norm"), node.args)) | node.kwargs
    return named["self"], named.get("n"), named.get("dim", -1), named.get("norm")


@register_fx_node_fix(
    "executorch",
    model_side="AutoformerAttention should compute its autocorrelation (irfft(rfft(q) * conj(rfft(k)))) with "
               "real ops \u2014 the circular correlation as a gather, product and sum \u2014 so no complex tensors or "
               "_conj_copy reach to_edge.",
)
def _fix_fft_cross_correlation_as_real_sum(graph_module, node) -> bool:
    """Autoformer finds its periods by the cross-correlation theorem, ``irfft(rfft(q) * conj(rfft(k)))``: complex
    tensors, which to_edge refuses ("_conj_copy does not support automatic differentiation"). The same circular
    correlation, ``out[tau] = sum_t q[(t + tau) mod n] * k[t]``, is a gather from q laid twice end to end, a product
    and a sum: real ops, n² terms for a window of n."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    aten = torch.ops.aten
    if node.op != "call_function" or node.target is not aten.fft_irfft.default:
        return False
    product, n, dim, norm = _fft_arguments(node)
    if n is None or norm is not None or getattr(product, "target", None) is not aten.mul.Tensor:
        return False
    conjugated = [factor for factor in product.args if getattr(factor, "target", None) in _CONJUGATES]
    if len(conjugated) != 1 or len(product.args) != 2:
        return False
    spectra = (next(factor for factor in product.args if factor is not conjugated[0]), conjugated[0].args[0])
    if not all(getattr(spectrum, "target", None) is aten.fft_rfft.default for spectrum in spectra):
        return False
    (shifted, *rest), (fixed, *rest_fixed) = (_fft_arguments(spectrum) for spectrum in spectra)
    if rest != [n, dim, None] or rest_fixed != [n, dim, None]:
        return False
    length = n.meta["val"] if isinstance(n, torch.fx.Node) else n
    dim %= shifted.meta["val"].dim()
    if not all(statically_known_true(source.meta["val"].shape[dim] == length) for source in (shifted, fixed)):
        return False  # rfft would pad or cut: not this sum

    graph = graph_module.graph
    call = functools.partial(_call, graph)
    # in the program's fake mode: `arange` has no tensor argument to take it from
    with graph.inserting_before(node), shifted.meta["val"].fake_mode:
        positions = call(aten.arange.default, n)
        lags_and_times = call(
            aten.add.Tensor, call(aten.unsqueeze.default, positions, 1), call(aten.unsqueeze.default, positions, 0)
        )
        doubled = call(aten.cat.default, [shifted, shifted], dim)
        gathered = call(aten.index_select.default, doubled, dim, call(aten.view.default, lags_and_times, [-1]))
        lagged = call(aten.unflatten.int, gathered, dim, [n, n])  # (..., lag, time, ...)
        terms = call(aten.mul.Tensor, lagged, call(aten.unsqueeze.default, fixed, dim))
        correlation = call(aten.sum.dim_IntList, terms, [dim + 1])
    node.replace_all_uses_with(correlation)
    graph.erase_node(node)
    return True


@register_fx_node_fix(
    "executorch",
    model_side="SpeechT5SpeechDecoderPrenet._consistent_dropout should return its input unchanged when p is 0 "
               "(and skip the torch.bernoulli draw), since it keeps dropout in eval mode.",
)
def _fix_certain_bernoulli(graph_module, node) -> bool:
    """`bernoulli` is not in the Core ATen opset. With a probability of 0 or 1 it draws nothing at random: zeros or
    ones (SpeechT5's decoder prenet keeps its dropout in eval mode, with p = 0 here)."""
    if node.op != "call_function" or node.target is not torch.ops.aten.bernoulli.p:
        return False
    source, probability = node.args[0], node.args[1] if len(node.args) > 1 else node.kwargs.get("p", 0.5)
    if probability not in (0, 1):
        return False
    fill = torch.ops.aten.ones_like.default if probability == 1 else torch.ops.aten.zeros_like.default
    node.target, node.args, node.kwargs = fill, (source,), {}
    return True


def _scaled_by_zero(node) -> bool:
    """Whether every use of ``node`` is a product by 0, or a product whose every use is."""
    products = (torch.ops.aten.mul.Tensor, torch.ops.aten.mul.Scalar)
    for user in node.users:
        if user.target not in products:
            return False
        factor = user.args[1] if user.args[0] is node else user.args[0]
        if not (isinstance(factor, (int, float)) and factor == 0) and not _scaled_by_zero(user):
            return False
    return bool(node.users)


@register_fx_node_fix(
    "executorch",
    model_side="VitsModel.forward (and the stochastic duration predictor) should skip drawing torch.randn_like "
               "noise when noise_scale / noise_scale_duration is 0 instead of multiplying the draw by zero.",
)
def _fix_noise_scaled_by_zero(graph_module, node) -> bool:
    """The runtime draws nothing at random ("randn_like is not in Core ATen"). Noise whose scale is 0 (VITS with
    `noise_scale=0`, as the sweep runs it to compare with eager) is multiplied away: zeros give the same numbers,
    the infinities and NaNs of the other factors included."""
    aten = torch.ops.aten
    zeros = {aten.randn.default: aten.zeros.default, aten.randn_like.default: aten.zeros_like.default}
    if node.op != "call_function" or node.target not in zeros or not _scaled_by_zero(node):
        return False
    node.target = zeros[node.target]  # same arguments: the size or the tensor, then dtype, layout, device
    return True


# integer dtypes whose values, times a sort's length, fit in int64
_NARROW_INTEGERS = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32)


@register_fx_node_fix(
    "executorch",
    model_side="upstream change: ExecuTorch's portable kernel library should implement the Core ATen op "
               "aten.sort (values, and the stable variant with its tie order) so programs that sort or argsort "
               "load without OperatorMissing.",
)
def _fix_sort_as_topk(graph_module, node) -> bool:
    """The runtime has no sort kernel, so a program that sorts fails to load ("OperatorMissing"; ViTMAE's random
    masking argsorts its noise, SAM-HQ sorts its point scores). Sorting is a top-k of every element along the
    axis, which the runtime has; an argsort is that top-k's indices. The top-k orders equal values its own way
    where eager's sort keeps them in place (PP-DocLayoutV2 argsorts a 0/1 mask to put its kept boxes first, and
    its boxes came out shuffled): small integers are ranked by a key with their position as the tie-break."""
    aten = torch.ops.aten
    sorts = {aten.sort.default: False, aten.sort.stable: False, aten.argsort.default: True, aten.argsort.stable: True}
    if node.op != "call_function" or node.target not in sorts:
        return False
    positional = node.args[1:] if node.target in (aten.sort.default, aten.argsort.default) else ()
    arguments = {**dict(zip(("dim", "descending"), positional)), **node.kwargs}
    source, dim, descending = node.args[0], arguments.get("dim", -1), bool(arguments.get("descending", False))
    graph = graph_module.graph
    length = source.meta["val"].shape[dim]
    key = source
    if isinstance(length, int) and source.meta["val"].dtype in _NARROW_INTEGERS:
        with graph.inserting_before(node):
            key = _ranked_with_position_tie_break(graph, source, dim, length, descending)
    elif not isinstance(length, int):  # a symbolic length: read from the tensor at run time
        length = _call_after(graph, source, aten.sym_size.int, dim % source.meta["val"].dim())
    topk = _call_after(graph, key, aten.topk.default, length, dim, descending, True, after=node.prev)
    indices = _call_after(graph, topk, operator.getitem, 1)
    if sorts[node.target]:
        node.replace_all_uses_with(indices)
    else:  # the values are the source's, whatever the key
        values = _call_after(graph, source, aten.gather.default, dim, indices, after=indices)
        for user in list(node.users):
            user.replace_all_uses_with(values if user.args[1] == 0 else indices)
            graph.erase_node(user)
    graph.erase_node(node)
    return True


def _ranked_with_position_tie_break(graph, source, dim, length, descending):
    """``source * (length + 1) -/+ position``: the order of ``source``, and among equal values the first first."""
    aten = torch.ops.aten
    wide = _call(graph, aten._to_copy.default, source, dtype=torch.int64)
    positions = _call(graph, aten.cumsum.default, _call(graph, aten.ones_like.default, wide), dim)
    scaled = _call(graph, aten.mul.Scalar, wide, length + 1)
    return _call(graph, aten.sub.Tensor if descending else aten.add.Tensor, scaled, positions)


@register_fx_node_fix(
    "executorch",
    model_side="upstream change: ExecuTorch's memory-format pass should emit dim_order_ops._empty_dim_order with"
               " SymInt[] sizes (its schema takes int[]), so converting `empty` keeps dynamic sizes symbolic "
               "instead of pinning them.",
)
def _fix_empty_of_symbolic_size(graph_module, node) -> bool:
    """ExecuTorch's memory-format pass turns `empty` into `dim_order_ops._empty_dim_order`, whose size is `int[]`,
    not `SymInt[]`: converting a dynamic size to int pins it (DeepSeek-V2's MLA `new_empty` pinned batch and
    length). Its contents are undefined anyway, so zeros serve: `new_zeros`/`zeros` keep their sizes symbolic."""
    aten = torch.ops.aten
    replacements = {aten.new_empty.default: aten.new_zeros.default, aten.empty.memory_format: aten.zeros.default}
    if node.op != "call_function" or node.target not in replacements:
        return False
    size = node.args[1] if node.target is aten.new_empty.default else node.args[0]
    if not any(isinstance(dim, (torch.fx.Node, torch.SymInt)) for dim in size):
        return False
    node.target = replacements[node.target]
    node.kwargs = {key: value for key, value in node.kwargs.items() if key != "memory_format"}
    return True


@register_fx_node_fix(
    "executorch",
    model_side="upstream change: ExecuTorch should lower the runtime assert of a tensor condition "
               "(item(_is_all_true(c)) -> sym_ite -> _assert_scalar) to a runtime check or drop it, instead of "
               "evaluating sym_ite in Python during lowering and failing on the data-dependent guard.",
)
def _fix_tensor_condition_assert(graph_module, node) -> bool:
    """A check on a tensor condition (`torch._check_tensor_all`: vision-language models compare their image-token
    count with their feature count) traces as `item(_is_all_true(c))` turned into an integer by `sym_ite` and
    asserted equal to 1. ExecuTorch evaluates `sym_ite` in Python while lowering, where the value is unknown, and
    fails on the guard. The assert is dropped from the program: it only rejects malformed inputs, and ExecuTorch
    has no runtime assert to carry it."""
    if node.op != "call_function" or node.target is not torch.ops.aten._assert_scalar.default:
        return False
    conversions = [arg for arg in getattr(node.args[0], "args", ()) if getattr(arg, "target", None) is torch.sym_ite]
    if not any(_is_tensor_truth(conversion.args[0]) for conversion in conversions):
        return False
    graph_module.graph.erase_node(node)
    return True


@register_fx_node_fix(
    "executorch",
    model_side="T5ForSequenceClassification.forward should check that every example has the same number of EOS "
               "tokens without torch.unique_consecutive (e.g. torch._check((counts == counts[0]).all()) or "
               "comparing min and max), since unique_consecutive is not Core ATen.",
)
def _fix_size_only_check(graph_module, node) -> bool:
    """A tensor computed only to assert on its length: T5's classification head checks that every example has as
    many EOS tokens with `len(unique_consecutive(counts)) == 1`. `unique_consecutive` is not in Core ATen, so
    to_edge rejects a program that only needs it for that check. The assert is dropped (it only rejects malformed
    inputs), and the tensor with it."""
    if node.op != "call_function" or node.target is not torch.ops.aten._assert_scalar.default:
        return False
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    # walk the symbolic arithmetic of the condition back to the lengths it reads; any tensor value there is data
    sizes, pending, seen = [], [node.args[0]], set()
    while pending:
        current = pending.pop()
        if not isinstance(current, torch.fx.Node) or current in seen:
            continue
        seen.add(current)
        if current.target is torch.ops.aten.sym_size.int:
            sizes.append(current)
        elif isinstance(current.meta.get("val"), torch.Tensor):
            return False
        else:
            pending.extend(current.all_input_nodes)
    # only a data-dependent length, of a tensor nothing else reads
    if not sizes or not all(free_unbacked_symbols(size.meta.get("val")) for size in sizes):
        return False
    if any(user.target is not torch.ops.aten.sym_size.int for size in sizes for user in size.args[0].users):
        return False
    graph_module.graph.erase_node(node)
    return True


def _is_tensor_truth(node) -> bool:
    """``node`` is ``item(_is_all_true(tensor))``."""
    return (
        getattr(node, "target", None) is torch.ops.aten.item.default
        and getattr(node.args[0], "target", None) is torch.ops.aten._is_all_true.default
    )
