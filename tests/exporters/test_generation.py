"""Generation through exported prefill and decode programs, in each backend's runtime, against eager generate()."""

import pytest
import torch

from exporters.generation import (
    Generated,
    compare_generation,
    eager_generate,
    export_for_generation,
    generation_prompt,
    takes_positions,
    without_decoder_inputs,
)

from .conftest import TOLERANCE

NEW_TOKENS = 8
CASES = [
    ("LlamaForCausalLM", "dynamic"),
    ("LlamaForCausalLM", "static"),
    ("T5ForConditionalGeneration", "dynamic"),
    ("WhisperForConditionalGeneration", "dynamic"),
]


@pytest.mark.parametrize("backend", ["dynamo", "onnx", "executorch"])
@pytest.mark.parametrize("model_name, cache", CASES, ids=[f"{m}-{c}" for m, c in CASES])
def test_generated_tokens_equal_eager(tiny, model_name, cache, backend):
    model = tiny(model_name)
    prompt = without_decoder_inputs(model.inputs["A"])
    expected = eager_generate(model.model, prompt, NEW_TOKENS)
    generator = export_for_generation(model.model, prompt, backend, cache=cache)
    generated = generator.generate(prompt, NEW_TOKENS)
    assert generated.tokens.shape == expected.tokens.shape == (2, NEW_TOKENS)
    assert torch.equal(generated.tokens, expected.tokens)
    for step, (ours, theirs) in enumerate(zip(generated.logits, expected.logits)):
        torch.testing.assert_close(ours, theirs, atol=TOLERANCE[backend], rtol=TOLERANCE[backend], msg=f"step {step}")
    comparison = compare_generation(expected, generated, TOLERANCE[backend], TOLERANCE[backend])
    assert comparison.ok and comparison.tokens_equal


def _generated(tokens, logits):
    return Generated(torch.tensor(tokens), [torch.tensor(step) for step in logits])


def test_a_differing_token_at_a_near_tie_is_reported_as_such():
    eager = _generated([[1, 2]], [[[0.0, 5.0, 1.0]], [[0.0, 3.0, 3.0000001]]])
    ours = _generated([[1, 1]], [[[0.0, 5.0, 1.0]], [[0.0, 3.0000002, 3.0000001]]])
    comparison = compare_generation(eager, ours, 1e-4, 1e-4)
    assert comparison.ok and not comparison.tokens_equal
    assert (comparison.first_mismatch, comparison.near_tie) == (1, 1)
    assert "nearly tie" in comparison.message


def test_a_differing_token_without_a_tie_fails():
    eager = _generated([[1, 2]], [[[0.0, 5.0, 1.0]], [[0.0, 1.0, 3.0]]])
    ours = _generated([[1, 1]], [[[0.0, 5.0, 1.0]], [[0.0, 4.0, 3.0]]])
    comparison = compare_generation(eager, ours, 1e-4, 1e-4)
    assert not comparison.ok and comparison.first_mismatch == 1 and comparison.near_tie is None
    assert comparison.message.startswith("token 1 differs from eager")


def test_unknown_cache_kind_is_refused(tiny):
    model = tiny("LlamaForCausalLM")
    with pytest.raises(ValueError, match="unknown cache 'paged'"):
        export_for_generation(model.model, model.inputs["A"], "dynamo", cache="paged")


def test_the_eager_reference_is_plain_greedy_whatever_the_model_config_asks(tiny):
    model = tiny("LlamaForCausalLM")
    prompt = without_decoder_inputs(model.inputs["A"])
    saved = model.model.generation_config.forced_eos_token_id
    model.model.generation_config.forced_eos_token_id = 5  # PLBart's config forces its EOS at the last step
    try:
        reference = eager_generate(model.model, prompt, NEW_TOKENS)
    finally:
        model.model.generation_config.forced_eos_token_id = saved
    tokens = prompt["input_ids"]
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model.model(input_ids=tokens, attention_mask=torch.ones_like(tokens)).logits
            tokens = torch.cat([tokens, logits[:, -1:].argmax(-1)], 1)
    assert torch.equal(reference.tokens, tokens[:, -NEW_TOKENS:])


@pytest.mark.parametrize("backend", ["dynamo", "onnx"])
def test_a_cache_returned_as_views_feeds_the_next_decode_step(tiny, backend):
    model = tiny("Gemma2ForCausalLM")  # its sliding-window layers return their keys as a strided slice
    prompt = without_decoder_inputs(model.inputs["A"])
    expected = eager_generate(model.model, prompt, NEW_TOKENS)
    generated = export_for_generation(model.model, prompt, backend).generate(prompt, NEW_TOKENS)
    assert torch.equal(generated.tokens, expected.tokens)


@pytest.mark.parametrize("model_name", ["RobertaForCausalLM", "GPTJForCausalLM"])
def test_positions_and_token_types_are_fed_as_generate_feeds_them(tiny, model_name):
    """generate() counts positions from the attention mask (RoBERTa's own start after its padding index) and repeats
    the last token type for every new token (GPT-J embeds token types)."""
    model = tiny(model_name)
    prompt = without_decoder_inputs(model.inputs["A"])
    expected = eager_generate(model.model, prompt, NEW_TOKENS)
    generated = export_for_generation(model.model, prompt, "dynamo").generate(prompt, NEW_TOKENS)
    assert compare_generation(expected, generated, TOLERANCE["dynamo"], TOLERANCE["dynamo"]).ok


def test_the_prompt_loses_what_generate_drops_before_the_first_step(tiny):
    model = tiny("CTRLLMHeadModel")  # CTRL makes its own token types: generate() drops the caller's
    prompt = generation_prompt(model.model, model.inputs["A"])
    assert sorted(prompt) == ["attention_mask", "input_ids"]
    expected = eager_generate(model.model, model.inputs["A"], NEW_TOKENS)
    generated = export_for_generation(model.model, prompt, "dynamo").generate(prompt, NEW_TOKENS)
    assert compare_generation(expected, generated, TOLERANCE["dynamo"], TOLERANCE["dynamo"]).ok
    gptj = tiny("GPTJForCausalLM")  # which embeds them: they stay
    assert sorted(generation_prompt(gptj.model, gptj.inputs["A"])) == ["attention_mask", "input_ids", "token_type_ids"]


def _sweep_class(name):
    """The sweep's own tiny model of a class and its prompt (the tiny config and inputs of `harness`)."""
    from harness.cells import ClassContext
    from harness.models import select

    context = ClassContext(select(name)[0]).prepare()
    return context.model, generation_prompt(context.model, context.inputs["A"])


def _generates_like_eager(model, prompt, backend="dynamo"):
    """Exports ``model`` for generation, asserts its tokens are eager greedy's, and returns the generator."""
    expected = eager_generate(model, prompt, NEW_TOKENS)
    generator = export_for_generation(model, prompt, backend)
    comparison = compare_generation(expected, generator.generate(prompt, NEW_TOKENS), TOLERANCE[backend], TOLERANCE[backend])
    assert comparison.ok and comparison.tokens_equal, comparison.message
    return generator


def test_a_vision_language_prompt_generates_with_its_grid_positions_and_precomputed_tower_inputs():
    """Qwen2-VL's prompt (the sweep's) carries its 3-D rotary positions and the tower's precomputed kwargs
    (``image_cu_seqlens``), which generate() refuses by name: eager computes those itself, and each decode step is
    one past the grid's furthest position."""
    model, prompt = _sweep_class("Qwen2VLForConditionalGeneration")
    assert prompt["position_ids"].dim() == 3 and "image_cu_seqlens" in prompt
    _generates_like_eager(model, prompt)


@pytest.mark.parametrize("backend", ["dynamo", "onnx"])
def test_a_model_that_keeps_no_cache_generates_through_one_program_over_the_grown_sequence(backend):
    """GPT-1 returns no cache: generate() re-reads the whole sequence at each step, and so does the loop, through one
    program whose sequence axis is dynamic."""
    generator = _generates_like_eager(*_sweep_class("OpenAIGPTLMHeadModel"), backend)
    assert generator.cache is None and generator.prefill is generator.decode


def test_a_cacheless_model_that_appends_a_token_to_each_step_is_fed_it_after_the_sequence():
    """XLM's step preparation appends its mask token to the sequence, and generate() reads the next token's logits
    there. Fed the sequence alone, the program read them at the last real token: other tokens from the first step."""
    generator = _generates_like_eager(*_sweep_class("XLMWithLMHeadModel"))
    assert generator.cache is None and generator.appended.tolist() == [[0], [0]]  # the tiny config's mask token


def test_a_model_that_cannot_make_its_own_cache_generates_without_one_as_generate_does():
    """BLT's forward sizes the cache it makes from a config that has no layer count, so its tiny config, like
    generate(), runs without one. The prefill asked for a cache anyway and failed before any export."""
    model, prompt = _sweep_class("BltForCausalLM")
    assert model.generation_config.use_cache is False
    generator = _generates_like_eager(model, prompt)
    assert generator.cache is None and generator.prefill is generator.decode
    model, prompt = _sweep_class("MptForCausalLM")  # its config says no cache too, but its forward can make one
    assert model.generation_config.use_cache is False
    assert _generates_like_eager(model, prompt).cache == "past_key_values"


def test_a_pooled_indexer_generates_past_the_pools_of_its_prompt():
    """GLM-5 Next's indexer pools its keys. A prompt that completes no pool traces the decode program with none,
    guarded on the length staying under one pool; the tiny prompt holds two, and generation completes more."""
    model, prompt = _sweep_class("Glm5NextForConditionalGeneration")
    pool, length = model.config.text_config.index_kpool, prompt["input_ids"].shape[1]
    assert length // pool >= 2 and (length + NEW_TOKENS) // pool > length // pool
    _generates_like_eager(model, prompt)


def test_a_block_indexer_generates_past_the_block_count_of_its_prompt():
    """Qwen 4 Exp's indexer pools keys into blocks of 4. Its patch counted the blocks with max() and one_hot(),
    which fixed the decode program to the count at trace time: it refused the step whose cache makes a third."""
    model, prompt = _sweep_class("Qwen4ExpForCausalLM")
    ratio, length = model.config.indexer_compress_ratio, prompt["input_ids"].shape[1]
    assert (length + NEW_TOKENS) // ratio > (length + 1) // ratio
    _generates_like_eager(model, prompt)


def test_an_encoder_decoder_reading_its_encoders_downsampled_mask_gets_it_from_the_prefill():
    """Moonshine's decoder reads ``encoder_outputs.attention_mask``, the mask its encoder downsampled, which the
    model's own output drops: the prefill returns it, and every decode step takes it beside the states."""
    generator = _generates_like_eager(*_sweep_class("MoonshineForConditionalGeneration"))
    assert generator.encoder_extras == ["encoder_outputs.attention_mask"]
    assert "encoder_outputs.attention_mask" in generator.prefill.output_names


def test_an_encoder_decoder_reading_an_image_opens_its_decoder_with_the_prompt_tokens():
    """PP-FormulaNet's encoder reads the image; generate() hands the prompt's tokens to the decoder, after the start
    token (the first token differed while the decoder started from the start token alone)."""
    generator = _generates_like_eager(*_sweep_class("PPFormulaNetForConditionalGeneration"))
    assert generator.tokens_to_decoder and "input_ids" not in generator.prefill.input_names


@pytest.mark.parametrize("model_name, name, how", [
    ("XmodForCausalLM", "lang_ids", "whole"),
    ("MllamaForConditionalGeneration", "cross_attention_mask", "last"),
    ("IdeficsForVisionText2Text", "image_encoder_embeddings", "output:image_hidden_states"),
])  # fmt: skip
def test_what_generate_hands_every_decode_step_is_carried_into_the_decode_program(model_name, name, how):
    """Without it X-MOD's decode step had no language and IDEFICS's no image (both failed to export), and Mllama's
    token attended every tile, padding too (its logits drifted by 1.5e-4)."""
    generator = _generates_like_eager(*_sweep_class(model_name))
    assert generator.carried.get(name) == how


def test_positions_a_model_drops_when_it_prepares_a_step_are_not_fed():
    """Kosmos-2.5 counts its positions from its padding index and drops the ones generate() would pass."""
    model, prompt = _sweep_class("Kosmos2_5ForConditionalGeneration")
    assert not takes_positions(model, prompt)
    _generates_like_eager(model, prompt)


@pytest.mark.parametrize("backend", ["dynamo", "executorch"])
def test_a_chunked_attention_decode_program_counts_the_tokens_it_has_seen_from_the_mask(backend):
    """Llama 4's chunked layers count seen tokens in a Python int: traced as such, the decode program only ran the
    traced step (a guard on the mask's length failed at the next)."""
    _generates_like_eager(*_sweep_class("Llama4ForCausalLM"), backend)


def test_the_eager_reference_leaves_the_prompt_it_is_given_as_it_was():
    """BLIP's generate() sets each prompt's first token in place. The prompt is the class's inputs, so every later
    cell of the class compared its program on other tokens than eager's outputs came from (logits 0.33 off)."""
    model, prompt = _sweep_class("BlipForConditionalGeneration")
    before = {name: value.clone() for name, value in prompt.items() if isinstance(value, torch.Tensor)}
    eager_generate(model, prompt, NEW_TOKENS)
    for name, value in before.items():
        assert torch.equal(prompt[name], value), name


def test_a_decode_position_cast_with_int_stays_symbolic_in_the_decode_program():
    """ProphetNet casts its decode step's position with `int()`: the program was guarded on the traced cache length
    and refused the next step ("Guard failed: 1 + past_key_values['layers.0.keys'].size()[2] == 8")."""
    generator = _generates_like_eager(*_sweep_class("ProphetNetForCausalLM"))
    assert "_patch_prophetnet_decode_position_symbolic" in generator.applied


def test_a_decode_step_that_reads_every_token_so_far_is_fed_the_whole_sequence_with_its_cache():
    """CPM-Ant's generate() hands each step every token so far (it prepends its prompt embeddings and slices the
    cached part off itself). Fed the new token alone, the decode step did not export ("The size of tensor a (s56)
    must match the size of tensor b (33)")."""
    generator = _generates_like_eager(*_sweep_class("CpmAntForCausalLM"))
    assert generator.whole_sequence
    assert not _generates_like_eager(*_sweep_class("LlamaForCausalLM")).whole_sequence


def test_an_encoder_decoder_with_sliding_window_layers_decodes_past_its_window():
    """T5Gemma's decoder alternates sliding-window layers (a window of 4 in the tiny config) with full ones, and
    starts from one token: its sliding layers grow, then stay full. The decode program was guarded on the traced
    length and refused the first step ("Guard failed: 8 + 8 * ...size()[2] == 24"); 8 tokens cross the window."""
    from transformers.cache_utils import DynamicSlidingWindowLayer

    update = DynamicSlidingWindowLayer.update
    _generates_like_eager(*_sweep_class("T5GemmaForConditionalGeneration"))
    assert DynamicSlidingWindowLayer.update is update  # the sliding layers are themselves again after the traces


@pytest.mark.parametrize("backend", ["dynamo", "onnx"])
def test_a_state_space_cache_travels_as_cache_params_and_decode_takes_no_mask(tiny, backend):
    model = tiny("MambaForCausalLM")
    prompt = without_decoder_inputs(model.inputs["A"])
    expected = eager_generate(model.model, prompt, NEW_TOKENS)
    generated = export_for_generation(model.model, prompt, backend).generate(prompt, NEW_TOKENS)
    assert compare_generation(expected, generated, TOLERANCE[backend], TOLERANCE[backend]).ok


def test_a_recurrent_state_travels_as_the_cache_the_model_names_it():
    """RWKV's cache is `state`, a list of its layers' states. Taken for a model that keeps none, it was re-read over
    the whole sequence at each step, which its stateful steps do not equal (logits 1.24 apart at the second token)."""
    generator = _generates_like_eager(*_sweep_class("RwkvForCausalLM"))
    assert generator.cache == "state"


def test_sliding_window_decode_logits_stay_within_dynamo_tolerance(tiny):
    # drifted by ~2e-4 from the third step while decode steps took no position_ids
    model = tiny("Gemma2ForCausalLM")
    prompt = without_decoder_inputs(model.inputs["A"])
    expected = eager_generate(model.model, prompt, NEW_TOKENS)
    generated = export_for_generation(model.model, prompt, "dynamo").generate(prompt, NEW_TOKENS)
    assert compare_generation(expected, generated, TOLERANCE["dynamo"], TOLERANCE["dynamo"]).ok
