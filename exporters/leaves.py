"""Inputs and outputs by name: every tensor leaf of a tree by its dotted path, and the split of keyword inputs into
traced tensors and constants baked into the program (``SIZE_INPUTS``, read as sizes, are constants when static).

torch is imported on first use: the package stays cheap to import.
"""

from __future__ import annotations

from typing import Any


def key_path_name(path) -> str:
    """``(MappingKey('past_key_values'), GetAttrKey('layers.0.keys'))`` -> ``'past_key_values.layers.0.keys'``."""
    parts = []
    for key in path:
        for attribute in ("key", "name", "idx"):
            if hasattr(key, attribute):
                parts.append(str(getattr(key, attribute)))
                break
        else:
            parts.append(str(key))
    return ".".join(parts) or "output"  # a bare tensor, not inside any container


def named_leaves(tree: Any) -> dict[str, Any]:
    """Every tensor leaf of ``tree`` (a ModelOutput, a Cache, nested tuples...) by its dotted path."""
    import torch
    from torch.utils import _pytree

    leaves, _ = _pytree.tree_flatten_with_path(tree)
    return {key_path_name(path): leaf for path, leaf in leaves if isinstance(leaf, torch.Tensor)}


def spec_leaf_names(spec) -> list[str]:
    """The dotted names of the leaves of a pytree spec, in flattening order."""
    import torch
    from torch.utils import _pytree

    # Markers are tensors, so every node type (caches included) keeps them as leaves when flattened again.
    markers = [torch.empty(0) for _ in range(spec.num_leaves)]
    leaves, _ = _pytree.tree_flatten_with_path(_pytree.tree_unflatten(markers, spec))
    names = {id(leaf): key_path_name(path) for path, leaf in leaves}
    return [names[id(marker)] for marker in markers]


# Inputs whose values a model reads as sizes: the per-image geometry it crops, tiles and loops by (LLaVA-NeXT's
# any-resolution grid, Pixtral's crops, Qwen-VL's patch grids, how many of the grids each sample owns in GLM-Image,
# VideoLLaMA 3's per-image merge factors), and the audio frames the Qwen audio towers chunk by
# (``feature_attention_mask``, a per-sample count of real frames).
# Traced, their values become data-dependent sizes that export cannot guard on nor ExecuTorch plan memory for. A
# static export fixes every shape, so it bakes these in too: the geometry is part of the program, and calling it
# with another one is refused.
SIZE_INPUTS = ("image_sizes", "image_grid_thw", "video_grid_thw", "grid_thw", "image_grid_hw", "spatial_shapes",
               "target_sizes", "feature_attention_mask", "images_per_sample", "merge_sizes",
               "image_merge_sizes", "video_merge_sizes")


def constant_value(name: str, value: Any) -> Any:
    """``value`` as a constant baked into a program: a size input's tensor as nested lists of ints."""
    import torch

    return value.tolist() if name in SIZE_INPUTS and isinstance(value, torch.Tensor) else value


def split_inputs(inputs: dict[str, Any], sizes_as_constants: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split keyword inputs into traced ones (anything holding a tensor) and constants baked into the program; with
    ``sizes_as_constants`` (a static export), the ``SIZE_INPUTS`` are constants too."""
    import torch
    from torch.utils import _pytree

    traced, constants = {}, {}
    for name, value in inputs.items():
        if sizes_as_constants:
            value = constant_value(name, value)
        if any(isinstance(leaf, torch.Tensor) for leaf in _pytree.tree_leaves(value)):
            traced[name] = value
        else:
            constants[name] = value
    return traced, constants
