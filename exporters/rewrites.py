"""Rewrites that several backends register, each written once here and registered by a short decorated ``def`` in
each backend's folder (which carries the workaround's name and docstring):

- ``running_extremes_by_comparison``: ``torch.cummax``/``cummin`` from comparisons (ONNX, ExecuTorch stage "torch
  patches");
- ``contiguity_asked_without_guards``: torch's contiguity test without a guard on a symbolic size (the Dynamo trace,
  ExecuTorch's re-trace);
- ``resize_weights``: the weights of torch's bilinear and antialiased bicubic resizes, for resizes as matrix
  products (Dynamo's position-table resizes, ExecuTorch's antialiased resize);
- ``contiguous_copy``: an FX node copying a value into contiguous memory (ONNX and ExecuTorch node fixes);
- ``without_autograd_for_scans``: lowering a program that holds a `scan` (ONNX decompositions, ExecuTorch lowering).
"""

from __future__ import annotations

import contextlib

import torch

from .registration import report_applied


def running_extremes_by_comparison(original):
    """``torch.cummax`` or ``torch.cummin`` (``original``) computed from comparisons: position i's extreme is that of
    the row with the values after i replaced by the value at i; its index, the last position holding it."""
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


def contiguity_asked_without_guards(original):
    """torch's ``is_contiguous`` (``original``) whose "false when unsure" answers without a guard on a symbolic size:
    a size is skipped or counted small only when it is so for every size the program takes."""
    from torch.fx.experimental.symbolic_shapes import is_nested_int, statically_known_true

    def is_contiguous(a, false_if_dde=False):
        symbolic = [size for size in a.shape if isinstance(size, torch.SymInt)]
        if not false_if_dde or not symbolic or any(is_nested_int(size) for size in symbolic):
            return original(a, false_if_dde)
        report_applied()
        if statically_known_true(a.numel() < 2):
            return True
        # a contiguous stride is the product of the sizes after it, as torch writes it with or without Max(1, size)
        product, product_of_nonzero = 1, 1
        for size, stride in reversed(tuple(zip(a.shape, a.stride()))):
            if statically_known_true(size == 1):
                continue
            if not (statically_known_true(stride == product) or statically_known_true(stride == product_of_nonzero)):
                return False
            product, product_of_nonzero = product * size, product_of_nonzero * torch.sym_max(size, 1)
        return True

    return is_contiguous


def _keys_cubic(distance: torch.Tensor) -> torch.Tensor:
    """Keys' cubic kernel with a = -0.5, the one torch's antialiased bicubic resize filters with."""
    x = distance.abs()
    near = (1.5 * x - 2.5) * x * x + 1
    far = ((-0.5 * x + 2.5) * x - 4) * x + 2
    return torch.where(x < 1, near, torch.where(x < 2, far, torch.zeros_like(x)))


def resize_weights(sizes: torch.Tensor, positions: torch.Tensor, source: int, antialias: bool,
                   mode: str = "bilinear") -> torch.Tensor:
    """The weights ``F.interpolate(mode=mode, align_corners=False)`` gives the ``source`` pixels of one axis for
    output ``positions`` when resized to ``sizes`` (tensors of a shape): a triangle one pixel wide (bilinear) or Keys'
    cubic two wide (bicubic, antialiased only), stretched by the scale when antialiased and shrinking; normalised,
    which clamps the edges as torch does. Zero outside the window."""
    scale = source / sizes.to(torch.float32)
    stretch = scale.clamp(min=1.0) if antialias else torch.ones_like(scale)
    center = scale * (positions.to(torch.float32) + 0.5)
    pixels = torch.arange(source, dtype=torch.float32, device=sizes.device)
    distance = (pixels - center[..., None] + 0.5) / stretch[..., None]
    weights = _keys_cubic(distance) if mode == "bicubic" else (1 - distance.abs()).clamp(min=0)
    return weights / weights.sum(-1, keepdim=True)


def contiguous_copy(graph, source):
    """A node copying ``source`` into contiguous memory, with its fake value; call it under ``graph.inserting_*``."""
    copy = graph.call_function(torch.ops.aten.clone.default, (source,), {"memory_format": torch.contiguous_format})
    copy.meta["val"] = source.meta["val"].clone(memory_format=torch.contiguous_format)
    return copy


def without_autograd_for_scans(exported_program):
    """`no_grad` around lowering a program that holds a `scan`: with autograd on, torch decomposes a scan to its
    training form, which returns the sizes it saves for backward among its outputs, and the lowering fails
    ("'SymInt' object has no attribute 'unsqueeze'"). Other programs lower as they always have."""
    scans = (node for module in exported_program.graph_module.modules() if isinstance(module, torch.fx.GraphModule)
             for node in module.graph.nodes if node.target is torch.ops.higher_order.scan)  # fmt: skip
    return torch.no_grad() if next(scans, None) is not None else contextlib.nullcontext()

