"""Index arithmetic the vision families share: whether a static export baked the image geometry in, a table resized to
each image's grid, where the patches of a block or of each part lie.
"""

from __future__ import annotations

import torch

from ...rewrites import resize_weights


def resized(table: torch.Tensor, rows, row, columns, column, antialias=True) -> torch.Tensor:
    """The (rows, columns, channels) ``table`` resized (bilinear) to each position's grid of ``rows`` x ``columns``,
    read at its ``row`` and ``column`` (tensors of one shape): computed in float32, as torch on CPU."""
    row_weights = resize_weights(rows, row, table.shape[0], antialias)
    column_weights = resize_weights(columns, column, table.shape[1], antialias)
    resized = torch.einsum("...r,...c,rcd->...d", row_weights, column_weights, table.to(torch.float32))
    return resized.to(table.dtype)


def block_patches(block_row, block_column, columns, factor):
    """Where, in row-major grids ``columns`` patches wide, the patches of each factor x factor block lie: the block
    coordinates' shape, then (factor, factor) in the block's row-major order."""
    offset = torch.arange(factor, device=block_row.device)
    row = (block_row * factor)[..., None, None] + offset[:, None]
    column = (block_column * factor)[..., None, None] + offset
    return row * columns[..., None, None] + column


def geometry_baked(sizes: torch.Tensor) -> bool:
    """Whether the trace knows these size inputs' values, as a static export bakes them in: the model's own
    image-by-image code then traces to the fixed shapes a static program wants."""
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(sizes, FakeTensor) and sizes.constant is not None


def computed_from_baked(function, sizes: torch.Tensor, *args):
    """``function(sizes, *args)`` run now on the baked sizes' real values, for code that reads nothing else: traced,
    its boolean indexing gives lengths the trace cannot know (unbacked), which ExecuTorch's re-trace then guards on;
    the program holds the result as a constant instead."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

    with unset_fake_temporarily(), disable_proxy_modes_tracing():
        return function(sizes.constant, *args)


def patch_total(sizes: torch.Tensor, at_most=None) -> int:
    """How many patches images of these sizes (a row of grid sides each) hold: read from the data, one number;
    ``at_most`` (the patches the model was given) bounds it, so that ExecuTorch can plan memory for it."""
    total = sizes.prod(-1).sum().item()
    torch._check(total >= 0)
    if at_most is not None:
        torch._check(total <= at_most)
    return total


def part_starts(sizes: torch.Tensor) -> torch.Tensor:
    """Where each part of these sizes begins, the parts laid end to end."""
    return sizes.cumsum(0) - sizes


def places_in_parts(sizes: torch.Tensor, total) -> tuple[torch.Tensor, torch.Tensor]:
    """Each of the ``total`` items of parts of these sizes laid end to end: its part, and its offset in the part."""
    item = torch.arange(total, device=sizes.device)
    part = torch.searchsorted(sizes.cumsum(0), item, right=True)
    return part, item - part_starts(sizes)[part]


def merged_patch_places(grid_thw, merge, total):
    """Where each of the ``total`` patches of frames laid out merge block by merge block (Qwen-VL's order) lies: its
    frame (counted over every image), the frame's first patch, rows and columns, and its own row and column in it."""
    frames, heights, widths = grid_thw.unbind(-1)
    # image by image, not frame by frame: a list of every frame would have a data-dependent length of its own
    frame_sizes = heights * widths
    image_sizes = frames * frame_sizes
    image, in_image = places_in_parts(image_sizes, total)
    frame_size = frame_sizes[image]
    frame_in_image, in_frame = in_image // frame_size, in_image % frame_size
    frame = part_starts(frames)[image] + frame_in_image
    start = part_starts(image_sizes)[image] + frame_in_image * frame_size
    rows, columns = heights[image], widths[image]
    block, within = in_frame // (merge * merge), in_frame % (merge * merge)
    row = block // (columns // merge) * merge + within // merge
    column = block % (columns // merge) * merge + within % merge
    return frame, start, rows, columns, row, column
