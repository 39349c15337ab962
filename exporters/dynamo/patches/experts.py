"""Stage 2 model patches: mixture-of-experts layers run dense, every expert on every token (`_every_expert`): NLLB-MoE,
Switch Transformers, LongCat-Flash, Step 3.7, DBRX. Their neighbours in registration order sit here too: Step 3.7's
tower positions, Gemma 3n's sparsity quantile, x-vector statistics pooled by masks.
"""

from __future__ import annotations

import statistics

import torch

from ...registration import register_patch


# ── Stage 2: Model patches ───────────────────────────────────────────────────


def _every_expert(hidden_states, chosen, weights, experts):
    """Mixture-of-experts layers loop over the experts a batch hits (`nonzero()`), a data-dependent loop
    torch.export cannot trace. Every expert runs on every token instead, weighted by its routing weight (zero where
    not chosen): the same sum. ``experts[i](hidden_states)`` is expert ``i``'s output; ``chosen`` holds expert
    indices, ``weights`` their routing weights, in the same layout."""
    output = torch.zeros_like(hidden_states)
    for index, expert in enumerate(experts):
        weight = ((chosen == index).to(weights.dtype) * weights).sum(dim=-1, keepdim=True)
        output = output + (expert(hidden_states) * weight).to(hidden_states.dtype)
    return output


@register_patch(
    "dynamo", "transformers.models.nllb_moe.modeling_nllb_moe.NllbMoeExperts.forward",
    model_side="NllbMoeExperts adopts transformers' experts interface (@use_experts_implementation, as "
               "Mixtral/Qwen MoE do) so the exportable batched_mm path replaces its `nonzero()` loop over hit "
               "experts.",
)
def _patch_nllb_moe_experts_dense(_original):
    """NLLB-MoE's experts, every one on every token (`_every_expert`), with eval mode's token-dropout scaling."""

    def forward(self, hidden_states, router_mask, router_probs):
        scale = 1 - self.moe_token_dropout if self.moe_token_dropout > 0 and not self.training else 1.0
        experts = [lambda x, i=i: self[f"expert_{i}"](x) * scale for i in range(self.num_experts)]
        return _every_expert(hidden_states, router_mask, router_probs, experts)

    return forward


@register_patch(
    "dynamo", "transformers.models.switch_transformers.modeling_switch_transformers.SwitchTransformersExperts.forward",
    model_side="SwitchTransformersExperts adopts transformers' experts interface (@use_experts_implementation) "
               "so an exportable implementation replaces its `nonzero()` loop over hit experts.",
)
def _patch_switch_transformers_experts_dense(_original):
    """Switch Transformers' experts, every one on every token (`_every_expert`). Its router hands over a one-hot
    expert mask per token (all zeros past an expert's capacity) and one routing weight per token."""

    def forward(self, hidden_states, selected_experts, routing_weights):
        mask = selected_experts[:, 0, :].to(routing_weights.dtype)
        chosen = torch.arange(self.num_experts, device=mask.device).expand_as(mask)
        experts = [self[f"expert_{index}"] for index in range(self.num_experts)]
        return _every_expert(hidden_states, chosen, mask * routing_weights, experts)

    return forward


@register_patch(
    "dynamo", "transformers.models.longcat_flash.modeling_longcat_flash.LongcatFlashExperts.forward",
    model_side="LongcatFlashExperts adopts transformers' experts interface (@use_experts_implementation), with "
               "its zero-compute experts as identity, so an exportable implementation replaces its `nonzero()` "
               "loop over hit experts.",
)
def _patch_longcat_flash_experts_dense(_original):
    """LongCat-Flash's experts, every one on every token (`_every_expert`); its zero-compute experts pass the
    tokens through, as in eager."""

    def forward(self, hidden_states, top_k_index, top_k_weights):
        def routed(index):
            def expert(x):
                gate, up = torch.nn.functional.linear(x, self.gate_up_proj[index]).chunk(2, dim=-1)
                return torch.nn.functional.linear(self.act_fn(gate) * up, self.down_proj[index])

            return expert

        experts = [
            self.identity_expert if index >= self.num_routed_experts or self.gate_up_proj is None else routed(index)
            for index in range(self.total_experts)
        ]
        return _every_expert(hidden_states, top_k_index, top_k_weights, experts)

    return forward


@register_patch(
    "dynamo", "transformers.models.step3p7.modeling_step3p7.Step3p7Experts.forward",
    model_side="Step3p7Experts adopts transformers' experts interface (@use_experts_implementation) so an "
               "exportable implementation replaces its `nonzero()` loop over hit experts.",
)
def _patch_step3p7_experts_dense(_original):
    """Step 3.7's experts, every one on every token (`_every_expert`), with their clamped gates; the index one past
    the last expert, which eager skips, matches none."""

    def forward(self, hidden_states, top_k_index, top_k_weights):
        def routed(index):
            def expert(x):
                gate_up = torch.nn.functional.linear(x, self.gate_up_proj[index])
                return torch.nn.functional.linear(self._apply_gate(gate_up), self.down_proj[index])

            return expert

        return _every_expert(hidden_states, top_k_index, top_k_weights, [routed(i) for i in range(self.num_experts)])

    return forward


@register_patch(
    "dynamo", "transformers.models.step3p7.modeling_step3p7.Step3p7VisionModel.forward",
    model_side="Step3p7VisionModel.forward lays out its rotary positions from the patch grid's own tensor sizes "
               "(arange over the grid's height/width) instead of writing the grid into a tensor and reading it "
               "back with `.tolist()`.",
)
def _patch_step3p7_positions_from_the_grid(_original):
    """Step 3.7's tower writes its patch grid into a tensor and reads it back (`tolist`) to lay out its rotary
    positions: under export the sizes read back are data-dependent, unrelated to the image's, and ExecuTorch plans
    the positions for the product of their bounds (2**36 elements, "bad number ... for type int32").
    The positions laid out from the grid's own sizes (row-major: one image, merge size 1); the rest is eager's."""
    from transformers.modeling_outputs import BaseModelOutput
    from transformers.utils.output_capturing import capture_outputs

    def forward(self, pixel_values, **kwargs):
        batch, _, height, width = pixel_values.shape
        rows, columns = height // self.embeddings.patch_size, width // self.embeddings.patch_size
        hidden_state = self.pre_layernorm(self.embeddings(pixel_values, interpolate_pos_encoding=True))
        row, column = torch.meshgrid(torch.arange(rows, device=hidden_state.device),
                                     torch.arange(columns, device=hidden_state.device), indexing="ij")
        position_embeddings = self.rotary_emb(hidden_state, torch.stack([row.flatten(), column.flatten()], dim=-1))
        for layer in self.layers:
            hidden_state = layer(hidden_state, position_embeddings=position_embeddings, **kwargs)
        hidden_state = hidden_state.permute(0, 2, 1).view(batch, hidden_state.shape[-1], rows, columns)
        hidden_state = self.downsampler2(self.downsampler1(hidden_state))
        return BaseModelOutput(last_hidden_state=hidden_state.flatten(2).permute(0, 2, 1))

    return capture_outputs(tie_last_hidden_states=False)(forward)


@register_patch(
    "dynamo", "transformers.models.dbrx.modeling_dbrx.DbrxExperts.forward",
    model_side="DbrxExperts adopts transformers' experts interface (@use_experts_implementation) so an "
               "exportable implementation replaces its `nonzero()` loop over hit experts (each a slice of the "
               "packed GLU weights).",
)
def _patch_dbrx_experts_dense(_original):
    """DBRX's experts, every one on every token (`_every_expert`), each a slice of the packed GLU weights."""

    def forward(self, hidden_states, top_k_index, top_k_weights):
        shape = hidden_states.shape
        packed = (-1, self.ffn_hidden_size, self.hidden_size)
        w1, v1, w2 = (weight.view(packed) for weight in (self.mlp.w1, self.mlp.v1, self.mlp.w2))
        experts = [lambda x, i=i: self.mlp(x, w1[i], v1[i], w2[i]) for i in range(self.num_experts)]
        flat = hidden_states.reshape(-1, self.hidden_size)
        return _every_expert(flat, top_k_index, top_k_weights, experts).view(shape)

    return forward


@register_patch(
    "dynamo", "transformers.models.gemma3n.modeling_gemma3n.Gemma3nTextMLP._gaussian_topk",
    model_side="Gemma3nTextMLP computes the normal quantile of its constant target sparsity once at init in "
               "Python (e.g. statistics.NormalDist().inv_cdf, stored as a float) instead of "
               "`torch.distributions.Normal(0, 1).icdf(...)` (traced as erfinv) in _gaussian_topk.",
)
def _patch_gemma3n_constant_icdf(_original):
    """Gemma 3n's sparse MLP takes the normal quantile of a constant (its target sparsity) with `Normal.icdf`,
    traced as `erfinv`: ONNX has no such function and ExecuTorch's Core ATen check rejects it. The quantile is the
    same number computed once in Python, so the traced graph keeps only the arithmetic on the inputs."""

    def gaussian_topk(self, inputs):
        std_multiplier = statistics.NormalDist().inv_cdf(self.activation_sparsity)
        inputs_mean = torch.mean(inputs, dim=-1, keepdim=True)
        inputs_std = torch.std(inputs, dim=-1, keepdim=True, unbiased=False)
        return torch.nn.functional.relu(inputs - (inputs_mean + inputs_std * std_multiplier))

    return gaussian_topk


@register_patch(
    "dynamo",
    *(
    f"transformers.models.{module}.{name}ForXVector.forward"
    for module, name in (
    ("wav2vec2.modeling_wav2vec2", "Wav2Vec2"),
    ("wav2vec2_bert.modeling_wav2vec2_bert", "Wav2Vec2Bert"),
    ("wav2vec2_conformer.modeling_wav2vec2_conformer", "Wav2Vec2Conformer"),
    ("data2vec.modeling_data2vec_audio", "Data2VecAudio"),
    ("unispeech_sat.modeling_unispeech_sat", "UniSpeechSat"),
    ("wavlm.modeling_wavlm", "WavLM"),
    )
    ),
    model_side="The Wav2Vec2-family *ForXVector.forward heads pool the per-sample mean/std with a frame mask "
               "over the whole batch instead of a Python loop over `hidden_states[i, :length]`.",
)
def _patch_xvector_masked_statistics(original):
    """X-vector heads pool each sample's mean and std over its own length with a Python loop over the batch
    (`hidden_states[i, :length]`): the batch axis is fixed and ExecuTorch cannot lower the slice to an unbacked
    length. The same statistics come from a frame mask over the whole batch at once."""

    def forward(self, *args, attention_mask=None, labels=None, **kwargs):
        from transformers.modeling_outputs import XVectorOutput

        if attention_mask is None:
            return original(self, *args, labels=labels, **kwargs)
        if self.config.use_weighted_layer_sum:
            kwargs["output_hidden_states"] = True
        outputs = getattr(self, self.base_model_prefix)(*args, attention_mask=attention_mask, **kwargs)
        if self.config.use_weighted_layer_sum:
            weights = torch.nn.functional.softmax(self.layer_weights, dim=-1)
            hidden_states = (torch.stack(outputs.hidden_states, dim=1) * weights.view(-1, 1, 1)).sum(dim=1)
        else:
            hidden_states = outputs.last_hidden_state
        hidden_states = self.projector(hidden_states)
        for tdnn_layer in self.tdnn:
            hidden_states = tdnn_layer(hidden_states)

        lengths = self._get_tdnn_output_lengths(self._get_feat_extract_output_lengths(attention_mask.sum(dim=1)))
        frames = torch.arange(hidden_states.shape[1], device=hidden_states.device)
        mask = (frames[None, :] < lengths[:, None]).unsqueeze(-1).to(hidden_states.dtype)
        count = mask.sum(dim=1)
        mean = (hidden_states * mask).sum(dim=1) / count
        std = (((hidden_states - mean[:, None]) ** 2 * mask).sum(dim=1) / (count - 1)).sqrt()

        output_embeddings = self.feature_extractor(torch.cat([mean, std], dim=-1))
        logits = self.classifier(output_embeddings)
        loss = self.objective(logits, labels) if labels is not None else None
        return XVectorOutput(
            loss=loss,
            logits=logits,
            embeddings=output_embeddings,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )

    return forward
