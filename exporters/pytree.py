"""Pytree registration (Dynamo stage 3): every transformers ``Cache`` type, and a model's own ``*Cache`` classes,
flatten to their tensors and rebuild, so torch.export takes and returns them; a saved program is read back with them.

A cache flattens to its tensors (the leaves, keyed by attribute path like `layers.0.keys`) and a JSON skeleton of
everything else (the context), from which `_unflatten_from_context` rebuilds an equal object. The skeleton is a
string, so it is hashable, comparable and saved as is with a `.pt2`. A type the attribute walk cannot handle gets a
branch in both functions. The non-tensor state a program was traced with is in that skeleton:
``object_state_difference`` says where a call's differs. A sliding layer's count of tokens seen is the one number
that can follow the input instead: where a layer's keys hold that many, it is kept as their length.
"""

from __future__ import annotations

import importlib
import inspect
import json
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree

_TAG = "§"  # marks a skeleton node that is not plain JSON


def _qualified_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _import_qualified(name: str) -> Any:
    module_name, _, qualname = name.partition(":")
    value = importlib.import_module(module_name)
    for part in qualname.split("."):
        value = getattr(value, part)
    return value


def _concrete(symbolic):
    """The value of a symbolic scalar that the trace has already fixed, else None."""
    from torch.fx.experimental.symbolic_shapes import free_symbols

    if free_symbols(symbolic):
        return None
    return {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(symbolic)](symbolic)


def _flatten_to_context(value: Any, path: str, leaves: list) -> Any:
    """The JSON skeleton of ``value``; its tensors (and free symbolic scalars) are appended to ``leaves``."""
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        fixed = _concrete(value)
        if fixed is not None:
            return fixed
    if isinstance(value, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)):
        leaves.append((path, value))
        return {_TAG: "leaf", "index": len(leaves) - 1}
    if isinstance(value, torch.dtype):
        return {_TAG: "dtype", "name": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {_TAG: "device", "name": str(value)}
    if isinstance(value, type):
        return {_TAG: "type", "name": _qualified_name(value)}
    if isinstance(value, torch.nn.Module):
        raise TypeError(f"{path or 'value'}: a {type(value).__name__} module inside a cache cannot be flattened")
    join = f"{path}." if path else ""
    if type(value) in (list, tuple):
        items = [_flatten_to_context(item, f"{join}{i}", leaves) for i, item in enumerate(value)]
        return items if type(value) is list else {_TAG: "tuple", "items": items}
    if isinstance(value, dict):
        pairs = [  # keys as skeletons too: JSON would turn a tuple key into an unhashable list
            [_flatten_to_context(key, path, leaves), _flatten_to_context(item, f"{join}{key}", leaves)]
            for key, item in value.items()
        ]
        return {_TAG: "dict", "class": _qualified_name(type(value)), "pairs": pairs}
    if hasattr(value, "__dict__") and not callable(value):
        return _flatten_object(value, path, leaves)
    raise TypeError(f"{path or 'value'}: cannot flatten a {type(value).__name__} for torch.export")


def _flatten_object(value: Any, path: str, leaves: list, counted: tuple[int, int] | None = None) -> dict:
    join = f"{path}." if path else ""
    state = {}
    for key, item in vars(value).items():
        if key == "cumulative_length" and counted is not None:
            state[key] = {_TAG: "length", "layer": counted[0], "dim": counted[1]}
        elif key == "layers" and type(item) is list and (held := _counts_held_as_lengths(item)):
            state[key] = [_flatten_object(layer, f"{join}layers.{i}", leaves, held.get(i))
                          if hasattr(layer, "__dict__") else _flatten_to_context(layer, f"{join}layers.{i}", leaves)
                          for i, layer in enumerate(item)]  # fmt: skip
        else:
            state[key] = _flatten_to_context(item, f"{join}{key}", leaves)
    return {_TAG: "object", "class": _qualified_name(type(value)), "state": state}


def _counts_held_as_lengths(layers: list) -> dict[int, tuple[int, int]]:
    """A cache's sliding-window layers count the tokens they have seen (``cumulative_length``). Where a layer's own
    keys (it is not yet full) or another layer's (a full-attention layer keeps every token) hold exactly that many,
    the count is kept as that length, ``{layer: (layer holding it, its sequence axis)}``: a program taking the cache
    (a decoder fed an encoder's) then reads the count from the input's shape instead of baking the traced one in. A
    count no layer holds stays a number, and a call with another is refused by the skeleton check."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    held = [(j, layer.keys.dim() - 2, layer.keys.shape[-2]) for j, layer in enumerate(layers)
            if isinstance(getattr(layer, "keys", None), torch.Tensor) and layer.keys.dim() >= 2]  # fmt: skip
    counted = {}
    for i, layer in enumerate(layers):
        seen = getattr(layer, "cumulative_length", None)
        if not isinstance(seen, (int, torch.SymInt)) or isinstance(seen, bool):
            continue
        # its own keys first; compared without a guard, as a trace flattens its outputs too
        matching = [(j != i, j, axis) for j, axis, length in held if statically_known_true(seen == length)]
        if matching:
            _, j, axis = min(matching)
            counted[i] = (j, axis)
    return counted


@dataclass(frozen=True)
class _HeldLength:
    """A count to read from a layer's keys: ``layers[layer].keys.shape[dim]``."""

    layer: int
    dim: int


def _unflatten_from_context(skeleton: Any, leaves: list) -> Any:
    if isinstance(skeleton, list):
        return [_unflatten_from_context(item, leaves) for item in skeleton]
    if not isinstance(skeleton, dict):
        return skeleton
    kind = skeleton[_TAG]
    if kind == "leaf":
        return leaves[skeleton["index"]]
    if kind == "length":  # resolved by the cache holding the layers, once they are all rebuilt
        return _HeldLength(skeleton["layer"], skeleton["dim"])
    if kind == "dtype":
        return getattr(torch, skeleton["name"])
    if kind == "device":
        return torch.device(skeleton["name"])
    if kind == "type":
        return _import_qualified(skeleton["name"])
    if kind == "tuple":
        return tuple(_unflatten_from_context(item, leaves) for item in skeleton["items"])
    if kind == "dict":
        cls = _import_qualified(skeleton["class"])
        pairs = skeleton["pairs"]
        return cls((_unflatten_from_context(key, leaves), _unflatten_from_context(item, leaves)) for key, item in pairs)
    if kind == "object":
        cls = _import_qualified(skeleton["class"])
        value = cls.__new__(cls)
        value.__dict__.update({key: _unflatten_from_context(item, leaves) for key, item in skeleton["state"].items()})
        for layer in value.__dict__.get("layers", None) or ():
            held = getattr(layer, "cumulative_length", None)
            keys = getattr(value.layers[held.layer], "keys", None) if isinstance(held, _HeldLength) else None
            if isinstance(keys, torch.Tensor) and keys.dim() > held.dim:  # not a naming pass's placeholder leaves
                layer.cumulative_length = keys.shape[held.dim]
        return value
    raise ValueError(f"unknown skeleton node {kind!r}")


def _flatten_with_keys(value):
    leaves: list = []
    skeleton = _flatten_to_context(value, "", leaves)
    return [(_pytree.MappingKey(path), leaf) for path, leaf in leaves], json.dumps(skeleton)


def _flatten(value):
    keyed, context = _flatten_with_keys(value)
    return [leaf for _key, leaf in keyed], context


def _unflatten(leaves, context: str):
    return _unflatten_from_context(json.loads(context), list(leaves))


def _register(cls: type) -> None:
    if cls in _pytree.SUPPORTED_NODES:
        return
    _pytree.register_pytree_node(
        cls,
        _flatten,
        _unflatten,
        serialized_type_name=_qualified_name(cls),
        flatten_with_keys_fn=_flatten_with_keys,
        to_dumpable_context=lambda context: context,
        from_dumpable_context=lambda context: context,
    )


def _subclasses(cls: type):
    for subclass in cls.__subclasses__():
        yield subclass
        yield from _subclasses(subclass)


def register_pytree_nodes(model: torch.nn.Module | None = None) -> None:
    """Register every transformers ``Cache`` type, and the ``*Cache`` classes of ``model``'s module."""
    from transformers.cache_utils import Cache

    for cls in [Cache, *_subclasses(Cache)]:
        _register(cls)
    if model is not None:
        module = inspect.getmodule(type(model))
        for _name, value in inspect.getmembers(module, inspect.isclass):
            if value.__module__ == module.__name__ and value.__name__.endswith("Cache"):
                _register(value)


def is_flattened_here(cls: type) -> bool:
    """Whether ``cls`` flattens by this module's functions: its pytree context is the JSON skeleton of its state."""
    node = _pytree.SUPPORTED_NODES.get(cls)
    return node is not None and node.flatten_fn is _flatten


def object_state_difference(value: Any, baked: str) -> str | None:
    """Where ``value``'s non-tensor state differs from the ``baked`` one (``layers.0.cumulative_length: 5, exported
    with 7``), or None."""
    node = _pytree.SUPPORTED_NODES.get(type(value))
    if node is None or node.flatten_fn is not _flatten:
        return f"a {type(value).__name__}, exported with another type"
    return _first_difference(json.loads(_flatten(value)[1]), json.loads(baked), "")


def _described(node: Any) -> str:
    if isinstance(node, dict) and node.get(_TAG) == "length":
        return f"the length of layers.{node['layer']}.keys"
    return repr(node)


def _first_difference(here: Any, there: Any, path: str) -> str | None:
    if here == there:
        return None
    if type(here) is list and type(there) is list and len(here) == len(there):
        pairs = [(f"{path}.{i}", a, b) for i, (a, b) in enumerate(zip(here, there))]
    elif all(isinstance(node, dict) and node.get(_TAG) == "object" for node in (here, there)) and (
        here["class"] == there["class"] and here["state"].keys() == there["state"].keys()
    ):
        pairs = [(f"{path}.{key}", here["state"][key], there["state"][key]) for key in here["state"]]
    else:
        return f"{path.lstrip('.') or 'its structure'}: {_described(here)}, exported with {_described(there)}"
    return next(filter(None, (_first_difference(a, b, where) for where, a, b in pairs)), None)

