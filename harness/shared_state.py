"""What every cell of a class reads, kept as eager left it: the class's inputs, eager's outputs, and the model's
weights, buffers and mode. The cells of a class share them in one worker, so a cell that writes into them (BLIP's
generate() once set its prompt's first token in place) would change every later cell's result unseen. After each
cell ``KeptState.restore`` says what was changed and puts it back, or says it cannot and the class is built again.
"""

from __future__ import annotations

import copy
from typing import Any


class KeptState:
    """A copy of a class context's shared state, taken once, after eager."""

    def __init__(self, context):
        self._kept = copy.deepcopy(_shared_state(context))

    def restore(self, context) -> tuple[list[str], bool]:
        """What a cell changed of ``context``'s shared state, each as ``part path (how)`` ([] when nothing), and
        whether it could all be put back as kept."""
        from torch.utils._pytree import keystr, tree_flatten_with_path

        changed, weights_restructured, now = [], False, _shared_state(context)
        for part, kept in self._kept.items():
            now_leaves, now_spec = tree_flatten_with_path(now[part])
            kept_leaves, kept_spec = tree_flatten_with_path(kept)
            if now_spec != kept_spec:
                changed.append(f"{part}: its structure (entries added, removed or replaced by another type)")
                weights_restructured |= part == "weights"
                continue
            pairs = zip(now_leaves, kept_leaves)
            changed += [f"{part}{keystr(path)} ({how})" for (path, now_value), (_, kept_value) in pairs
                        if (how := _leaf_change(now_value, kept_value))]  # fmt: skip
        if not changed:
            return changed, True
        kept = copy.deepcopy(self._kept)
        context.inputs.clear(), context.inputs.update(kept["inputs"])
        context.expected.clear(), context.expected.update(kept["expected"])
        if weights_restructured:  # a weight or buffer added or removed: loading the copy would not undo it
            return changed, False
        try:  # in place, so tied weights stay tied
            context.model.load_state_dict(kept["weights"])
        except RuntimeError:  # a weight replaced by one of another shape
            return changed, False
        context.model.train(kept["training"])
        return changed, True


def _shared_state(context) -> dict[str, Any]:
    # state_dict: parameters and persistent buffers; a non-persistent buffer is a cache a forward may grow or
    # recompute to the same values (sinusoidal positions, dynamic rotary frequencies)
    return {"inputs": context.inputs, "expected": context.expected, "weights": dict(context.model.state_dict()),
            "training": context.model.training}  # fmt: skip


def _leaf_change(now, kept) -> str | None:
    """How one leaf of the shared state differs from its kept copy, or None."""
    import torch

    if isinstance(kept, torch.Tensor):
        if not isinstance(now, torch.Tensor):
            return f"a tensor became {type(now).__name__}"
        if now.shape != kept.shape or now.dtype != kept.dtype:
            return f"{kept.dtype} {list(kept.shape)} became {now.dtype} {list(now.shape)}"
        if torch.equal(now, kept):
            return None
        different = int((torch.nan_to_num(now) != torch.nan_to_num(kept)).sum())  # NaNs, which equal nothing
        return f"{different} of {kept.numel()} values written in place" if different else None
    if isinstance(kept, (bool, int, float, str, type(None))):  # other objects have no value equality to check
        return None if now == kept else f"{kept!r} became {now!r}"
    return None
