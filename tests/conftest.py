"""The nightly tier: tests too slow for the 20-minute test run, run beside the nightly sweep
(``pytest -n auto -m nightly``; ``-m ""`` runs both tiers).

Each is a real export whose mechanism the default tier also exercises, on a smaller model or another backend, or the
with-and-without check of a large composite model. Beside each, its minutes in one run of the whole suite here
(2 workers, 2026-12-01): together 46 of the suite's 83 minutes of test time. An entry is a test id or its start.
"""

import pytest

NIGHTLY = [
    # ExecuTorch lowering of the encoder-decoders and of dynamic text models (Llama and BERT static, ViT stay)
    "tests/exporters/test_parity.py::test_export_matches_eager[T5ForConditionalGeneration-executorch",  # 3.0
    "tests/exporters/test_parity.py::test_export_matches_eager[WhisperForConditionalGeneration-executorch",  # 2.0
    "tests/exporters/test_parity.py::test_export_matches_eager[BertModel-executorch-dynamic]",  # 0.7
    "tests/exporters/test_parity.py::test_export_matches_eager[LlamaForCausalLM-executorch-dynamic]",  # 0.9
    # generation through ExecuTorch (Dynamo and ONNX generate in the test run)
    "tests/exporters/test_generation.py::test_generated_tokens_equal_eager[LlamaForCausalLM-dynamic-executorch]",  # 2.4
    "tests/exporters/test_generation.py::test_generated_tokens_equal_eager[LlamaForCausalLM-static-executorch]",  # 1.8
    "tests/exporters/test_generation.py::test_generated_tokens_equal_eager[T5ForConditionalGeneration-dynamic-executorch]",  # 3.4
    "tests/exporters/test_generation.py::test_generated_tokens_equal_eager[WhisperForConditionalGeneration-dynamic-executorch]",  # 1.3
    "tests/exporters/test_generation.py::test_generated_tokens_equal_eager[T5ForConditionalGeneration-dynamic-onnx]",  # 0.7
    "tests/exporters/test_generation.py::test_a_chunked_attention_decode_program_counts_the_tokens_it_has_seen_from_the_mask[executorch]",  # 1.6
    # with and without their workarounds, composite models
    "tests/exporters/workarounds/test_dynamo_lengths.py::test_a_dynamic_cell_passes_with_its_workarounds_and_fails_without_each[Qwen2_5_VLModel]",  # 4.1
    "tests/exporters/workarounds/test_dynamo_text.py::test_a_dynamic_cell_passes_with_its_workarounds_and_fails_without_each[ReformerModel]",  # 1.6
    "tests/exporters/workarounds/test_dynamo_lengths.py::test_a_dynamic_cell_passes_with_its_workarounds_and_fails_without_each[XcodecModel]",  # 0.8
    "tests/exporters/workarounds/test_executorch_lowering_patches.py::test_a_dynamic_cell_passes_with_its_workarounds_and_fails_without_each[SEWDModel]",  # two ExecuTorch exports of a minute or more
    "tests/exporters/workarounds/test_executorch_program_fixes.py::test_a_dynamic_cell_passes_with_its_workarounds_and_fails_without_each[BltForCausalLM]",  # the same
    "tests/exporters/workarounds/test_dynamo_images.py::test_a_dynamic_cell_passes_with_its_workarounds_and_fails_without_each[Lfm2VlModel]",  # 0.4
    "tests/exporters/workarounds/test_dynamo_audio.py::test_a_dynamic_cell_passes_with_its_workarounds_and_fails_without_each[OmDetTurboForObjectDetection]",  # 0.8
    "tests/exporters/workarounds/test_dynamo_audio_windows.py::test_a_dynamic_cell_passes_with_its_workarounds_and_fails_without_each[Qwen2_5OmniThinkerModel]",  # 0.5 (its grid's equivalence stays)
    "tests/exporters/workarounds/test_dynamo_lengths.py::test_a_model_class_exports_with_its_workaround_and_fails_without[_patch_pad_sequence_to_symbolic_longest]",  # 0.5
    "tests/exporters/workarounds/test_dynamo_generic.py::test_a_symbolic_batch_stays_where_the_code_reads_it_as_a_python_int[EsmForProteinFolding",  # 2.1
    "tests/exporters/workarounds/test_dynamo_audio.py::test_esmfold_traces_with_a_symbolic_batch_once_its_identity_frames_are_made_afresh",  # 1.4
    "tests/exporters/workarounds/test_dynamo_recurrent.py::test_funnel_relative_shift_as_a_gather_serves_every_length",  # 1.2
    "tests/exporters/workarounds/test_dynamo_text.py::test_funnel_keeps_its_sequence_axis_dynamic",  # 0.8
    "tests/exporters/workarounds/test_dynamo_lengths.py::test_vits_pads_its_relative_positions_for_any_text_length",  # 0.8
    # a second model, or the ExecuTorch half, of workarounds whose first model or other half stays
    "tests/exporters/workarounds/test_dynamo_lengths.py::test_an_audio_length_stays_symbolic[SEWDModel]",  # 0.6 (SEW stays)
    "tests/exporters/workarounds/test_dynamo_experts.py::test_gemma3n_sparsity_quantile_is_a_constant_for_export[executorch",  # 1.6
    "tests/exporters/workarounds/test_dynamo_rotary.py::test_complex_rotary_is_rotated_in_real_arithmetic[executorch",  # 0.8
    "tests/exporters/workarounds/test_dynamo_recurrent.py::test_lstm_as_scan_ops_is_the_lstm_in_both_directions_of_every_layer[executorch]",  # 0.9
    "tests/exporters/workarounds/test_dynamo_recurrent.py::test_a_scan_lowers_in_its_inference_form[executorch]",  # 0.7
    # ExecuTorch-only workarounds on models of a minute's lowering
    "tests/exporters/workarounds/test_executorch_node_fixes.py::test_executorch_returns_a_slice_that_keeps_everything_as_its_input",  # 1.0
    "tests/exporters/workarounds/test_dynamo_experts.py::test_a_model_class_exports_with_its_workaround_and_fails_without[_patch_xvector_masked_statistics]",  # 0.9
    "tests/exporters/workarounds/test_dynamo_vision_tokens.py::test_a_model_class_exports_with_its_workaround_and_fails_without[_patch_llama4_vision_rotary_as_pairs]",  # 0.8
    "tests/exporters/workarounds/test_executorch_torch_patches.py::test_a_model_class_exports_with_its_workaround_and_fails_without[_patch_fnet_fourier_as_matmul]",  # 0.6
    "tests/exporters/workarounds/test_executorch_program_fixes.py::test_a_model_class_exports_with_its_workaround_and_fails_without[_fix_counts_read_from_data_bounded]",  # BLT, 2 exports of a minute or two
    "tests/exporters/workarounds/test_executorch_lowering_patches.py::test_a_model_class_exports_with_its_workaround_and_fails_without[_patch_views_as_dynamic_as_their_base]",  # the same
    # the second cut (2026-12-02): the flat tail of half-minute tests
    "tests/harness/test_nightly.py::test_shards_of_one_plan_cover_the_sweep_and_merge_into_one_run",  # 2.0 (the nightly's own shards)
    "tests/exporters/test_generation.py::test_generated_tokens_equal_eager[LlamaForCausalLM-static-onnx]",  # 0.5 (dynamic stays)
    "tests/exporters/test_parity.py::test_export_matches_eager[ViTForImageClassification-executorch-dynamic]",  # 0.4
    "tests/exporters/test_parity.py::test_export_matches_eager[T5ForConditionalGeneration-onnx-dynamic]",  # 0.4
    "tests/exporters/workarounds/test_dynamo_attention.py::test_packed_images_attend_through_one_masked_sdpa[onnx]",  # 0.5 (Dynamo stays)
    "tests/harness/test_tiny.py::test_tiny_model_builds_and_runs_eager_with_its_modality[Qwen2_5OmniToken2WavBigVGANModel]",  # 0.5
    "tests/harness/test_tiny.py::test_tiny_model_builds_and_runs_eager_with_its_modality[Nemotron3_5TranscribeForConditionalGeneration]",  # 0.4
    "tests/exporters/workarounds/test_dynamo_lengths.py::test_blt_hashes_the_same_byte_groups_by_gather_and_keeps_its_length_symbolic",  # 0.5
    "tests/exporters/workarounds/test_dynamo_experts.py::test_a_model_class_exports_with_its_workaround_and_fails_without[_patch_longcat_flash_experts_dense]",  # 0.4
    "tests/exporters/workarounds/test_dynamo_text.py::test_a_model_keeps_its_axes_dynamic_with_its_workaround[_patch_led_pads_at_least_one_token]",  # 0.4
    "tests/exporters/workarounds/test_dynamo_lengths.py::test_a_dynamic_cell_passes_with_its_workarounds_and_fails_without_each[EncodecModel]",  # 0.4
    "tests/exporters/workarounds/test_dynamo_recurrent.py::test_recurrences_over_time_keep_a_symbolic_length_as_scan_ops[xLSTMModel",  # 0.4
    "tests/exporters/workarounds/test_executorch_node_fixes.py::test_executorch_attention_output_gets_one_layout",  # 0.4
    "tests/exporters/workarounds/test_dynamo_generic.py::test_a_symbolic_batch_stays_where_the_code_reads_it_as_a_python_int[RTDetrModel",  # 0.3 (Qwen2.5-Omni and DepthPro stay)
]  # fmt: skip


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marks
def pytest_collection_modifyitems(config, items):
    # a run of chosen tests (`file::test`) leaves other entries of their file unmatched, rightly
    whole_files = not any("::" in arg for arg in config.args)
    collected_files = {item.nodeid.split("::")[0] for item in items}
    for entry in NIGHTLY:
        matching = [item for item in items if item.nodeid.startswith(entry)]
        if not matching and whole_files and entry.split("::")[0] in collected_files:
            raise pytest.UsageError(f"tests/conftest.py: NIGHTLY entry {entry!r} names no test; fix or remove it")
        for item in matching:
            item.add_marker(pytest.mark.nightly)
