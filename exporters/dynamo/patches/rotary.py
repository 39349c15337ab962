"""Stage 2 model patches: complex rotary embeddings (DeepSeek-V2, Llama 4) rotated in real arithmetic, as (cos, sin)
pairs.
"""

from __future__ import annotations

import torch

from ...registration import register_patch


# ── Stage 2: Model patches ───────────────────────────────────────────────────


@register_patch(
    "dynamo",
    "transformers.models.deepseek_v2.modeling_deepseek_v2.DeepseekV2RotaryEmbedding.forward",
    "transformers.models.llama4.modeling_llama4.Llama4TextRotaryEmbedding.forward",
    model_side="DeepseekV2RotaryEmbedding and Llama4TextRotaryEmbedding return real (cos, sin) tables instead of"
               " a complex `torch.polar` table.",
)
def _patch_complex_rotary_as_pairs(_original):
    """DeepSeek-V2 and Llama 4 make their rotary table complex (`torch.polar`) and rotate with complex products:
    ONNX has no complex tensors and ExecuTorch cannot lower `view_as_complex`. The table becomes real (cos, sin)
    pairs on a last axis of 2, and `_patch_rotate_pairs` rotates with them, the same numbers in real arithmetic."""
    from transformers.modeling_rope_utils import dynamic_rope_update

    @torch.no_grad()
    @dynamic_rope_update
    def forward(self, x, position_ids):
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        return torch.stack((freqs.cos(), freqs.sin()), dim=-1) * self.attention_scaling

    return forward


def rotate_pairs(x: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """``x * (cos + i sin)`` on the interleaved (real, imaginary) pairs of x's last axis."""
    real, imag = x.float().reshape(*x.shape[:-1], -1, 2).unbind(-1)
    cos, sin = cos_sin.unbind(-1)
    return torch.stack((real * cos - imag * sin, real * sin + imag * cos), dim=-1).flatten(-2).type_as(x)


@register_patch(
    "dynamo",
    "transformers.models.deepseek_v2.modeling_deepseek_v2.apply_rotary_emb",
    "transformers.models.llama4.modeling_llama4.apply_rotary_emb",
    model_side="DeepSeek-V2's and Llama 4's apply_rotary_emb rotate the (even, odd) pairs in real arithmetic "
               "with the cos/sin tables instead of `view_as_complex` products and `view_as_real`.",
)
def _patch_rotate_pairs(original):
    """The rotation half of `_patch_complex_rotary_as_pairs`. DeepSeek-V2 rotates (batch, heads, seq, dim) and
    Llama 4 (batch, seq, heads, dim): the heads axis of the table goes where the model's own broadcast puts it."""
    heads_axis = 1 if original.__module__.endswith("deepseek_v2") else 2

    def apply_rotary_emb(xq, xk, freqs_cis):
        table = freqs_cis.unsqueeze(heads_axis)
        return rotate_pairs(xq, table), rotate_pairs(xk, table)

    return apply_rotary_emb
