"""Tiny random transformers models, built from their config classes, and two input sets each.

Set "A" is what a model is exported with; set "B" has another batch and sequence length, to run dynamic exports.
"""

import pytest
import torch
import transformers

import exporters
from harness.cells import joined_parts

SIZES = {"A": (2, 7), "B": (3, 5)}
VOCAB = 99


def _tokens(batch, length):
    return torch.randint(3, VOCAB, (batch, length))


def _text(batch, length):
    return {"input_ids": _tokens(batch, length), "attention_mask": torch.ones(batch, length, dtype=torch.long)}


def _llama():
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )
    return transformers.LlamaForCausalLM(config), _text


def _bert():
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=64,
    )

    def inputs(batch, length):
        return {**_text(batch, length), "token_type_ids": torch.zeros(batch, length, dtype=torch.long)}

    return transformers.BertModel(config), inputs


def _vit():
    config = transformers.ViTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=37, num_labels=3,
    )
    return transformers.ViTForImageClassification(config), lambda batch, length: {
        "pixel_values": torch.randn(batch, 3, 32, 32)
    }


def _whisper():
    config = transformers.WhisperConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=37, decoder_ffn_dim=37, num_mel_bins=8, max_source_positions=30,
        max_target_positions=40, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
    )
    return transformers.WhisperForConditionalGeneration(config), lambda batch, length: {
        "input_features": torch.randn(batch, 8, 60),  # 2 x max_source_positions frames
        "decoder_input_ids": _tokens(batch, length),
    }


def _t5():
    config = transformers.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4, decoder_start_token_id=0
    )
    return transformers.T5ForConditionalGeneration(config), lambda batch, length: {
        **_text(batch, length),
        "decoder_input_ids": _tokens(batch, length),
    }


def _nllb_moe():
    config = transformers.NllbMoeConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=37, decoder_ffn_dim=37, num_experts=4, expert_capacity=8,
        max_position_embeddings=64, encoder_sparse_step=2, decoder_sparse_step=2,
    )
    return transformers.NllbMoeForConditionalGeneration(config), lambda batch, length: {
        **_text(batch, length),
        "decoder_input_ids": _tokens(batch, length),
    }


def _qwen2_moe():
    config = transformers.Qwen2MoeConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        num_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
    )  # fmt: skip
    return transformers.Qwen2MoeForCausalLM(config), _text


def _gemma2():
    config = transformers.Gemma2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64, sliding_window=4,
    )  # fmt: skip
    return transformers.Gemma2ForCausalLM(config), _text


def _gemma3n():
    config = transformers.Gemma3nTextConfig(
        vocab_size=VOCAB, vocab_size_per_layer_input=VOCAB, hidden_size=32, hidden_size_per_layer_input=8,
        intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        laurel_rank=4, max_position_embeddings=64, sliding_window=4, num_kv_shared_layers=0, altup_num_inputs=2,
        layer_types=["sliding_attention", "full_attention"], activation_sparsity_pattern=[0.95, 0.0],
    )  # fmt: skip
    return transformers.Gemma3nForCausalLM(config), _text


def _deepseek_v2():
    config = transformers.DeepseekV2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=37, moe_intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=8, q_lora_rank=None, qk_rope_head_dim=4,
        qk_nope_head_dim=4, v_head_dim=8, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
        first_k_dense_replace=1, max_position_embeddings=64,
    )  # fmt: skip
    return transformers.DeepseekV2ForCausalLM(config), _text


def _gpt2():
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    return transformers.GPT2LMHeadModel(config), _text


def _roberta_lm():
    config = transformers.RobertaConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=64, is_decoder=True,
    )
    return transformers.RobertaForCausalLM(config), _text


def _gptj():
    config = transformers.GPTJConfig(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64)

    def inputs(batch, length):  # GPT-J embeds token types with its word embeddings
        return {**_text(batch, length), "token_type_ids": torch.randint(0, 2, (batch, length))}

    return transformers.GPTJForCausalLM(config), inputs


def _mamba():
    config = transformers.MambaConfig(vocab_size=VOCAB, hidden_size=32, state_size=4, num_hidden_layers=2, expand=2)
    return transformers.MambaForCausalLM(config), _text


def _ctrl():
    config = transformers.CTRLConfig(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, dff=37, n_positions=64)

    def inputs(batch, length):
        return {**_text(batch, length), "token_type_ids": torch.randint(3, VOCAB, (batch, length))}

    return transformers.CTRLLMHeadModel(config), inputs


def _qwen2_vl_vision():
    from transformers.models.qwen2_vl import modeling_qwen2_vl

    config = transformers.Qwen2VLConfig().vision_config.__class__(
        depth=2, embed_dim=32, hidden_size=32, num_heads=4, patch_size=4, temporal_patch_size=2, spatial_merge_size=2,
    )
    patch = config.in_channels * config.temporal_patch_size * config.patch_size**2

    def inputs(batch, length):
        # `batch` images of 2 x (length - 3) patches each: two of set A's segments differ in size
        grid = torch.tensor([[1, 2, 2 * (length - 3 - index % 2)] for index in range(batch)])
        return {"hidden_states": torch.randn(int(grid.prod(-1).sum()), patch), "grid_thw": grid}

    return modeling_qwen2_vl.Qwen2VisionTransformerPretrainedModel(config), inputs


TINY_MODELS = {
    "Qwen2VisionTransformerPretrainedModel": _qwen2_vl_vision,
    "CTRLLMHeadModel": _ctrl,
    "MambaForCausalLM": _mamba,
    "RobertaForCausalLM": _roberta_lm,
    "GPTJForCausalLM": _gptj,
    "DeepseekV2ForCausalLM": _deepseek_v2,
    "Gemma2ForCausalLM": _gemma2,
    "GPT2LMHeadModel": _gpt2,
    "Gemma3nForCausalLM": _gemma3n,
    "Qwen2MoeForCausalLM": _qwen2_moe,
    "LlamaForCausalLM": _llama,
    "BertModel": _bert,
    "ViTForImageClassification": _vit,
    "WhisperForConditionalGeneration": _whisper,
    "T5ForConditionalGeneration": _t5,
    "NllbMoeForConditionalGeneration": _nllb_moe,
}

TOLERANCE = {"dynamo": 1e-4, "onnx": 1e-3, "executorch": 1e-3}


class Tiny:
    """A tiny model in eval mode, its input sets, and its eager outputs by name."""

    def __init__(self, name):
        torch.manual_seed(0)
        self.model, make_inputs = TINY_MODELS[name]()
        self.model.eval()
        self.inputs = {label: make_inputs(*size) for label, size in SIZES.items()}
        exporters.register_pytree_nodes(self.model)
        with torch.no_grad():
            self.expected = {label: exporters.named_leaves(self.model(**inputs)) for label, inputs in self.inputs.items()}


def assert_parity(actual, expected, tolerance):
    expected, _ = joined_parts(actual, expected)  # per-image parts an export keeps whole, as the sweep compares them
    assert list(actual) == [name for name in expected if name in actual], "outputs are ordered like eager's"
    assert set(actual) == set(expected), f"outputs differ: {sorted(set(actual) ^ set(expected))}"
    for name, value in expected.items():
        torch.testing.assert_close(actual[name], value, atol=tolerance, rtol=tolerance, msg=lambda m: f"{name}: {m}")


_cache = {}


@pytest.fixture
def tiny():
    """``tiny(name)``: the tiny model of a class, built once per test session."""

    def get(name):
        if name not in _cache:
            _cache[name] = Tiny(name)
        return _cache[name]

    return get
