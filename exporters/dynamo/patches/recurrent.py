"""Stage 2 model patches: recurrences over time as `scan` ops (Mamba, RecurrentGemma, RWKV, xLSTM, `nn.LSTM`) and the
delta rule's triangular solves; and, in registration order, 1-D max pooling by windows and Funnel's relative shift.
"""

from __future__ import annotations

import torch

from ...registration import register_patch, report_applied


# ── Stage 2: Model patches ───────────────────────────────────────────────────


@register_patch(
    "dynamo", "torch.nn.functional.max_pool1d", reports=True,
    model_side="upstream change: torch's aten::max_pool1d (check_max_pool1d / max_pool1d_impl in MaxPooling.cpp)"
               " computes its output width from SymInt sizes instead of guarding the input length to an int, so "
               "a symbolic sequence length is not specialized.",
)
def _patch_max_pool1d_by_windows(original):
    """The 1-D max-pooling kernel reads the sequence length as an int, so a symbolic length gets fixed (CANINE pools
    its character mask into molecules with it). Windows that tile the sequence (stride = kernel, no padding) are a
    reshape and a maximum, for any length; a last partial window is dropped, as the kernel drops it."""

    def first(value):
        return value[0] if isinstance(value, (tuple, list)) else value

    def max_pool1d(input, kernel_size, stride=None, padding=0, *args, **kwargs):
        options = {**dict(zip(("dilation", "ceil_mode", "return_indices"), args)), **kwargs}
        kernel = first(kernel_size)
        stride = kernel if stride is None or stride == [] else first(stride)
        tiled = stride == kernel and first(padding) == 0 and first(options.get("dilation", 1)) == 1
        tiled = tiled and not options.get("ceil_mode") and not options.get("return_indices")
        if not tiled or not isinstance(input.shape[-1], torch.SymInt):
            return original(input, kernel_size, stride, padding, *args, **kwargs)
        report_applied()
        windows = input.shape[-1] // kernel
        # the tiled steps gathered, not sliced: a slice would guard on whether a window is left over
        steps = torch.arange(windows * kernel, device=input.device)
        return input.index_select(-1, steps).unflatten(-1, (windows, kernel)).amax(dim=-1)

    return max_pool1d


@register_patch(
    "dynamo",
    *(f"transformers.models.{name}.modeling_{name}.mamba_selective_scan"
    for name in ("mamba", "falcon_mamba", "jamba", "zamba")),
    reports=True,
    model_side="transformers' mamba_selective_scan (mamba, falcon_mamba, jamba, zamba) runs its CPU fallback "
               "recurrence with torch's scan higher-order op (or a cumsum/parallel-scan formulation) instead of "
               "a Python loop over time steps.",
)
def _patch_selective_scan_as_scan_op(original):
    """Without their CUDA kernels, Mamba's selective scans loop over the time steps in Python: a symbolic sequence
    length cannot drive that loop, so the export fixes it. torch's `scan` operator carries the state through the
    same steps in the same order, for any length. A fixed length keeps the loop."""
    from torch._higher_order_ops.scan import scan

    def mamba_selective_scan(hidden_states, dt, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                             return_last_state=False, **kwargs):  # fmt: skip
        if not isinstance(hidden_states.shape[2], torch.SymInt):
            return original(hidden_states, dt, A, B, C, D=D, z=z, delta_bias=delta_bias, delta_softplus=delta_softplus,
                            return_last_state=return_last_state, **kwargs)  # fmt: skip
        report_applied()
        if delta_bias is not None:
            dt = dt + delta_bias.to(dt.dtype)[..., None]
        if delta_softplus:
            dt = torch.nn.functional.softplus(dt)
        # per time step (axis 0): the state's decay, its update, and the readout of the state
        decay = torch.exp(A[None, :, None, :] * dt[:, :, :, None]).movedim(2, 0)
        update = dt[:, :, :, None] * B.transpose(1, 2)[:, None].float() * hidden_states[:, :, :, None].float()
        update = update.movedim(2, 0)
        readout = C.movedim(2, 0)  # B and C come as (batch, state, time)

        def step(state, inputs):
            step_decay, step_update, step_readout = inputs
            state = step_decay * state + step_update
            return state, (state.to(hidden_states.dtype) * step_readout[:, None, :]).sum(-1)

        last_state, outputs = scan(step, torch.zeros_like(update[0]), (decay, update, readout))
        scan_output = outputs.movedim(0, -1)
        if D is not None:
            scan_output = scan_output + hidden_states * D[None, :, None]
        if z is not None:
            scan_output = scan_output * torch.nn.functional.silu(z)
        return (scan_output, last_state) if return_last_state else scan_output

    return mamba_selective_scan


@register_patch(
    "dynamo", "transformers.models.recurrent_gemma.modeling_recurrent_gemma.RecurrentGemmaRglru._rnn_scan",
    reports=True,
    model_side="RecurrentGemmaRglru._rnn_scan runs its linear recurrence with torch's scan op (or an "
               "associative/cumulative formulation) instead of a Python loop over time steps.",
)
def _patch_rg_lru_scan_as_scan_op(original):
    """RecurrentGemma's linear recurrence loops over the time steps in Python, as Mamba's scans do (see
    `_patch_selective_scan_as_scan_op`): `scan` runs the same steps for a symbolic length."""
    from torch._higher_order_ops.scan import scan

    def _rnn_scan(self, hidden_states, recurrent_gate, reset, recurrent_states, acc_dtype=torch.float32):
        if not isinstance(hidden_states.shape[1], torch.SymInt):
            return original(self, hidden_states, recurrent_gate, reset, recurrent_states, acc_dtype)
        report_applied()
        recurrent_gate = recurrent_gate * ~reset
        if recurrent_states is None:
            recurrent_states = torch.zeros(hidden_states[:, 0].shape, dtype=acc_dtype, device=hidden_states.device)

        def step(state, inputs):
            gate, update = inputs
            state = gate.type(acc_dtype) * state + update.type(acc_dtype)
            return state, state.to(hidden_states.dtype, copy=True)  # the carry and the output must not alias

        last_state, outputs = scan(step, recurrent_states, (recurrent_gate.movedim(1, 0), hidden_states.movedim(1, 0)))
        return outputs.movedim(0, 1), last_state

    return _rnn_scan


@register_patch(
    "dynamo", "transformers.models.rwkv.modeling_rwkv.rwkv_linear_attention_cpu", reports=True,
    model_side="transformers' rwkv_linear_attention_cpu carries numerator, denominator and running maximum "
               "through torch's scan op instead of a Python loop over time steps.",
)
def _patch_rwkv_attention_as_scan_op(original):
    """RWKV's attention without its CUDA kernel loops over the time steps in Python, as Mamba's scans do (see
    `_patch_selective_scan_as_scan_op`): `scan` carries its numerator, denominator and running maximum through the
    same steps for a symbolic length."""
    from torch._higher_order_ops.scan import scan

    def rwkv_linear_attention_cpu(time_decay, time_first, key, value, state=None, return_state=False):
        if not isinstance(key.shape[1], torch.SymInt):
            return original(time_decay, time_first, key, value, state=state, return_state=return_state)
        report_applied()
        keeps_state = return_state or state is not None
        if state is None:
            zeros = torch.zeros(key.shape[0], key.shape[2], dtype=torch.float32, device=key.device)
            state = [zeros, zeros.clone(), zeros - 1e38]
        decay = -torch.exp(time_decay)

        def step(carry, inputs):
            numerator_state, denominator_state, max_state = carry
            step_key, step_value = inputs
            step_key = step_key.float()
            max_for_output = torch.maximum(max_state, step_key + time_first)
            old, new = torch.exp(max_state - max_for_output), torch.exp(step_key + time_first - max_for_output)
            output = (old * numerator_state + new * step_value) / (old * denominator_state + new)
            max_for_state = torch.maximum(max_state + decay, step_key)
            old, new = torch.exp(max_state + decay - max_for_state), torch.exp(step_key - max_for_state)
            carry = [old * numerator_state + new * step_value, old * denominator_state + new, max_for_state]
            return carry, output.to(key.dtype)

        final, outputs = scan(step, [part.contiguous() for part in state], (key.movedim(1, 0), value.movedim(1, 0)))
        return outputs.movedim(0, 1), (final if keeps_state else None)

    return rwkv_linear_attention_cpu


@register_patch(
    "dynamo", "transformers.models.xlstm.modeling_xlstm.xLSTMBackend.forward", reports=True,
    model_side="xLSTMBackend.forward in inference mode runs the recurrent mLSTM step with torch's scan op for "
               "any length instead of chunkwise kernels on whole 64-step chunks plus a Python loop over the "
               "remainder.",
)
def _patch_mlstm_inference_as_scan_op(original):
    """xLSTM's inference kernel runs whole chunks of 64 steps in its chunkwise form and the rest one step at a time
    in a Python loop; both fix a symbolic length. The recurrent step is the same recurrence the chunkwise form
    reformulates, so `scan` over that step covers every length (see `_patch_selective_scan_as_scan_op`). Training
    mode keeps its kernel."""
    from torch._higher_order_ops.scan import scan
    from transformers.models.xlstm.modeling_xlstm import mlstm_recurrent_step_native

    def forward(self, query, key, value, igate, fgate, c_initial=None, n_initial=None, m_initial=None,
                return_last_states=None, mode=None):  # fmt: skip
        mode = mode or self.config.mode
        if "inference" not in mode or not isinstance(query.shape[2], torch.SymInt):
            return original(self, query, key, value, igate, fgate, c_initial, n_initial, m_initial,
                            return_last_states, mode)  # fmt: skip
        report_applied()
        state_dtype = getattr(torch, self.config.inference_state_dtype)
        batch, heads, _, key_size = query.shape
        if c_initial is None:
            c_initial = query.new_zeros(batch, heads, key_size, value.shape[-1], dtype=state_dtype)
            n_initial = query.new_zeros(batch, heads, key_size, dtype=state_dtype)
            m_initial = query.new_zeros(batch, heads, 1, dtype=state_dtype)

        def step(carry, inputs):
            step_query, step_key, step_value, step_igate, step_fgate = inputs
            output, carry = mlstm_recurrent_step_native(
                step_query, step_key, step_value, step_igate[:, :, None], step_fgate[:, :, None], *carry,
                eps=self.config.eps, dtype_state=state_dtype)  # fmt: skip
            return list(carry), output

        # time first; copies, as a scan's inputs must not alias one another
        steps = [tensor.movedim(2, 0).contiguous() for tensor in (query, key, value, igate, fgate)]
        initial = [state.to(state_dtype, copy=True) for state in (c_initial, n_initial, m_initial)]
        last, outputs = scan(step, initial, steps)
        return outputs.movedim(0, 2), tuple(last)

    return forward


@register_patch(
    "dynamo", "torch.nn.LSTM.forward", reports=True,
    upstream="https://github.com/pytorch/pytorch/issues/115092",
)
def _patch_lstm_as_scan_op(original):
    """`nn.LSTM` traces as one `aten.lstm` op whose shape rule fixes the sequence length (Parakeet's and Nemotron's
    transducer decoders). For a symbolic length each layer and direction is a `scan` over the time
    steps (see `_patch_selective_scan_as_scan_op`), with the input projection of every step done at once: the same
    gates, cell and hidden states. Packed sequences, projections and training-time dropout keep the op."""
    from torch._higher_order_ops.scan import scan

    def forward(self, input, hx=None):
        time_axis = 1 if self.batch_first else 0
        plain = isinstance(input, torch.Tensor) and input.dim() == 3 and not self.proj_size
        plain = plain and not (self.training and self.dropout)
        if not plain or not isinstance(input.shape[time_axis], torch.SymInt):
            return original(self, input, hx)
        report_applied()
        steps = input.transpose(0, 1) if self.batch_first else input  # (time, batch, features)
        directions = 2 if self.bidirectional else 1
        if hx is None:
            zeros = steps.new_zeros(self.num_layers * directions, steps.shape[1], self.hidden_size)
            hx = (zeros, zeros)
        last_hidden, last_cell = [], []
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(directions):
                suffix = f"_l{layer}" + ("_reverse" if direction else "")
                weight_hh = getattr(self, f"weight_hh{suffix}")
                bias_hh = getattr(self, f"bias_hh{suffix}") if self.bias else None
                bias_ih = getattr(self, f"bias_ih{suffix}") if self.bias else None
                ordered = steps.flip(0) if direction else steps
                projected = torch.nn.functional.linear(ordered, getattr(self, f"weight_ih{suffix}"), bias_ih)

                def step(carry, gates_in, weight_hh=weight_hh, bias_hh=bias_hh):
                    hidden, cell = carry
                    gates = gates_in + torch.nn.functional.linear(hidden, weight_hh, bias_hh)
                    in_gate, forget_gate, candidate, out_gate = gates.chunk(4, dim=-1)
                    cell = torch.sigmoid(forget_gate) * cell + torch.sigmoid(in_gate) * torch.tanh(candidate)
                    hidden = torch.sigmoid(out_gate) * torch.tanh(cell)
                    return [hidden, cell], hidden.clone()  # the carry and the output must not alias

                index = layer * directions + direction
                # copies: the initial states may be one tensor (zeros, or a cache's), and a scan's inputs must not
                # alias one another when ONNX and ExecuTorch decompose it
                initial = [hx[0][index].clone(), hx[1][index].clone()]
                (hidden, cell), output = scan(step, initial, projected)
                outputs.append(output.flip(0) if direction else output)
                last_hidden.append(hidden)
                last_cell.append(cell)
            steps = torch.cat(outputs, dim=-1) if directions == 2 else outputs[0]
        output = steps.transpose(0, 1) if self.batch_first else steps
        return output, (torch.stack(last_hidden), torch.stack(last_cell))

    return forward


@register_patch(
    "dynamo", "transformers.models.funnel.modeling_funnel._relative_shift_gather",
    model_side="transformers' funnel _relative_shift_gather reads the shifted relative-position scores with one "
               "index gather computed arithmetically instead of reshaping the score matrix to another width and "
               "back (which asks the trace to prove divisibilities of a symbolic length).",
)
def _patch_funnel_relative_shift_indexed(_original):
    """Funnel shifts its relative-position scores by reshaping the score matrix to another width and back, which
    with a symbolic length asks the trace to prove divisibilities it cannot, so the program keeps only lengths like
    the traced one. Each output element is one element of the flattened scores at an index that arithmetic gives:
    the same scores, read with one gather."""

    def _relative_shift_gather(positional_attn, context_len, shift):
        batch_size, n_head, seq_len, max_rel_len = positional_attn.shape
        rows = torch.arange(seq_len, device=positional_attn.device)[:, None]
        columns = torch.arange(context_len, device=positional_attn.device)[None, :]
        # where the reshape-drop-reshape lands element (row, column) in the flattened (seq_len, max_rel_len) scores
        index = shift * seq_len + rows * (max_rel_len - shift) + columns
        return positional_attn.reshape(batch_size, n_head, seq_len * max_rel_len)[:, :, index]

    return _relative_shift_gather


# Gated delta rule layers (Qwen3-Next family, OLMo Hybrid) solve each chunk's unit lower-triangular system with
# `solve_triangular`, which no ONNX or ExecuTorch op implements, and under export build its inverse row by row instead:
# 63 slice-and-scatter steps for a chunk of 64, hundreds of nodes per layer whose symbolic sizes make ExecuTorch's
# re-traces the slowest part of the sweep (its timeouts). Their module asks `is_torchdynamo_exporting` only there.
_DELTA_RULE_MODULES = ("olmo_hybrid", "qwen3_5", "qwen3_5_moe", "qwen3_next", "qwen4_exp")


@register_patch(
    "dynamo", *(f"transformers.models.{name}.modeling_{name}.is_torchdynamo_exporting"
    for name in _DELTA_RULE_MODULES),
    model_side="The gated-delta-rule chunk functions in qwen3_next / qwen3_5 / qwen3_5_moe / olmo_hybrid / "
               "qwen4_exp invert the unit lower-triangular UT system under export with a log-depth product form "
               "((I+N)(I+N^2)...) instead of the row-by-row forward-substitution loop they take when "
               "is_torchdynamo_exporting().",
)  # fmt: skip
def _patch_delta_rule_solves_as_eager(_original):
    """The trace takes eager's branch, the triangular solve, which `_patch_unit_triangular_solve_as_products`
    expresses in matrix products."""
    return lambda: False


@register_patch(
    "dynamo", "torch.linalg.solve_triangular", reports=True,
    model_side="upstream change: the ONNX exporter (onnxscript torchlib) and ExecuTorch provide a "
               "lowering/kernel for aten.linalg_solve_triangular (at least the unit lower-triangular case), so "
               "the solve need not be rewritten as matrix products.",
)
def _patch_unit_triangular_solve_as_products(original):
    """For a unit lower-triangular ``A = I - N`` (``N`` strictly lower, so ``N**n = 0``), ``A⁻¹ = I + N + N² + …``,
    which is ``(I + N)(I + N²)(I + N⁴)…``: about 2·log2(n) matrix products, exact up to rounding."""

    def solve_triangular(A, B, *, upper, left=True, unitriangular=False, out=None):
        size = A.shape[-1]
        if isinstance(size, torch.SymInt):  # a width reshaped out of a symbolic length may still be proven constant
            from torch.fx.experimental.symbolic_shapes import statically_known_true

            hint = size.node.hint
            size = hint if hint is not None and statically_known_true(size == hint) else None
        if upper or not left or not unitriangular or out is not None or size is None:
            return original(A, B, upper=upper, left=left, unitriangular=unitriangular, out=out)
        report_applied()
        power = -A.tril(-1)
        inverse = torch.eye(size, dtype=A.dtype, device=A.device) + power
        for _ in range(max(size - 1, 1).bit_length() - 1):  # the powers up to N**(n-1)
            power = power @ power
            inverse = inverse + inverse @ power
        return inverse @ B

    return solve_triangular


@register_patch(
    "dynamo", *(f"transformers.models.{name}.modeling_{name}.chunk_kimi_delta_attention"
    for name in ("bailing_hybrid", "glm5_next", "kimi_linear")), reports=True,
    model_side="chunk_kimi_delta_attention (kimi_linear, glm5_next, bailing_hybrid) uses a chunk no longer than "
               "the text (min(64, seq_len)) or inverts each chunk's triangular system with matrix products, "
               "instead of always unrolling a row-by-row inverse over a full 64-token chunk.",
)  # fmt: skip
def _patch_kimi_delta_chunks_fit_a_static_text(original):
    """Kimi delta attention (GLM-5 Next, Bailing Hybrid) inverts each chunk's triangular system row by row, always,
    one traced step per row of a 64-token chunk, whatever the text's length. The chunk is the algorithm's unit of
    work, not of its arithmetic: a static text shorter than a chunk is one chunk of its own length, the same outputs
    to rounding in as many steps as it has tokens. A symbolic length keeps the model's chunks (the program serves
    lengths up to one of them)."""

    def chunk_kimi_delta_attention(query, key, value, g, beta, chunk_size=64, **kwargs):
        length = query.shape[1]
        if isinstance(length, int) and length < chunk_size:
            report_applied()
            chunk_size = max(length, 1)
        return original(query, key, value, g, beta, chunk_size, **kwargs)

    return chunk_kimi_delta_attention
