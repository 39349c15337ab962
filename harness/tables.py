"""Lists that grow, kept as data: the smoke set, tiny-config overrides, wider tolerances. One reason per row."""

# The default `export-sweep run`: a few minutes of every kind of model.
SMOKE_SET = (
    # text encoders and decoders
    "BertModel",
    "DistilBertForSequenceClassification",
    "RobertaForMaskedLM",
    "GPT2LMHeadModel",
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "GemmaForCausalLM",
    "MistralForCausalLM",
    "Phi3ForCausalLM",
    # encoder-decoder
    "T5ForConditionalGeneration",
    "BartForConditionalGeneration",
    "MarianMTModel",
    # vision
    "ViTForImageClassification",
    "ResNetForImageClassification",
    "ConvNextForImageClassification",
    "SwinForImageClassification",
    "Dinov2Model",
    "SegformerForSemanticSegmentation",
    # audio
    "WhisperForConditionalGeneration",
    "Wav2Vec2ForCTC",
    "HubertModel",
    "ASTForAudioClassification",
    # multimodal
    "CLIPModel",
    "SiglipModel",
    "LlavaForConditionalGeneration",
    "Qwen2VLForConditionalGeneration",
    # mixture of experts
    "MixtralForCausalLM",
    "Qwen2MoeForCausalLM",
    # state-space
    "MambaForCausalLM",
    "Mamba2ForCausalLM",
    # time series
    "PatchTSTForPrediction",
)

# SAM 2's vision config, tiny: see its rows below.
_HIERA_STAGES = {"backbone_config.hidden_size": 8, "backbone_config.embed_dim_per_stage": [8, 16, 32, 64],
                 "backbone_channel_list": [64, 32, 16, 8], "backbone_feature_sizes": [[8, 8], [4, 4], [2, 2]]}

_DIGITS_AS_LETTERS = str.maketrans("0123456789", "ABCDEFGHIJ")  # Chameleon's image-token names spell codes so

# D-FINE-style detectors at the default init scale: the features fade (to 1e-14) through the backbone and hybrid
# encoder, so query selection ranks tied scores, whose order every runtime breaks its own way
_DETR_SIGNAL = {"initializer_range": 0.2, "backbone_config.initializer_range": 0.2}

# PP-OCR detectors: what only their checkpoints set. The intra-class blocks' convolutions as (kernel, stride,
# padding): square, tall and wide kernels that keep the map's size, as the block's docstring describes.
_PPOCR_KERNELS = {"long": 7, "mid": 5, "short": 3}
_PPOCR_INTRACLASS = {
    "reduce_channel": [1, 1, 0], "return_channel": [1, 1, 0],
    **{f"symmetric_conv_long_{ratio}ratio": [k, 1, k // 2] for ratio, k in _PPOCR_KERNELS.items()},
    **{f"vertical_long_to_small_conv_{ratio}ratio": [[k, 1], 1, [k // 2, 0]] for ratio, k in _PPOCR_KERNELS.items()},
    **{f"horizontal_small_to_long_conv_{ratio}ratio": [[1, k], 1, [0, k // 2]] for ratio, k in _PPOCR_KERNELS.items()},
}
# the intra-class neck: its four stages' maps upsampled to the finest; and the signal kept through the plain convs
_PPOCR_SERVER_NECK = {"intraclass_block_config": _PPOCR_INTRACLASS, "scale_factor_list": [1, 2, 4, 8],
                      "kernel_list": [3, 2, 2], "initializer_range": 0.2}
# PP-OCRv6 detectors default to the text recogniser's PP-LCNetV4 (one output, height-only strides): four outputs
# instead, each half the size of the one before, as the necks' top-down path adds them
_PPOCR_DET_BACKBONE = {
    "backbone_config.block_configs": [[[3, 32, 32, 1, True]], [[3, 32, 32, 2, False]], [[3, 32, 64, 2, False]],
                                      [[3, 64, 64, 2, False]]],
    "backbone_config.stage_out_channels": [32, 32, 64, 64],
    "backbone_config.out_features": ["stage1", "stage2", "stage3", "stage4"],
    "backbone_config.out_indices": [1, 2, 3, 4],
}

_QWEN4_INDEXER = {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 16, "indexer_budget": 8,
                  "indexer_compress_ratio": 4}

# model type -> {config attribute (dotted into sub-configs): value}, applied after the generic shrink; a row
# applies to its model type's config wherever it sits (a text config inside a multimodal one).
TINY_OVERRIDES: dict[str, dict] = {
    # the input projections group-normalize in 32 groups: at a width of 32 a group is one channel, one value on
    # the last (1x1) feature level, normalized into rounding noise that each export rounds its own way
    "grounding-dino": {"d_model": 64},
    "mm-grounding-dino": {"d_model": 64},
    # its default layout has no attention layer at all, which its own masks then ask for
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention"]},
    # block types cycle with period 3: keep one whole period so an attention block exists
    "recurrent_gemma": {"num_hidden_layers": 3},
    # the speaker encoder's last layer reads the middle layers' outputs side by side: as wide as they are together
    "qwen2_5_omni_dit": {"enc_channels": [32, 32, 32, 32, 96]},
    # GLM-Image writes its images' codebook tokens into the text: a codebook inside the shrunk vocabulary
    "glm_image": {"vq_config.num_embeddings": 64},
    # local attention over blocks of 512 and 32 global tokens padded a tiny text to one block (the dynamic ExecuTorch
    # program planned 3.5 GB for it); blocks of 4 make 7 tokens two blocks
    "pegasus_x": {"block_size": 4, "num_global_tokens": 4},
    # characters pooled into molecules leave the tiny texts (7 and 5 long) one or two molecules past the first, sizes
    # export specializes: a molecule per character
    "canine": {"downsampling_rate": 1},
    # attention layers are derived from attention_types in __post_init__, not from attention_layers
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},
    # the default text config fails the assistant's own validation: no per-layer inputs, every layer sharing the
    # keys and values (0 lets the config set the count to the shrunk layer count)
    "gemma4_assistant": {"text_config.hidden_size_per_layer_input": 0, "text_config.vocab_size_per_layer_input": 0,
                         "text_config.num_kv_shared_layers": 0},
    # per-block channels live in nested block_configs, which the generic shrink leaves at the stem's old width
    "pp_lcnet_v4": {"stem_channels": [3, 16, 32], "depths": [1, 1, 1, 1], "stage_out_channels": [32, 32, 64, 64],
                    "block_configs": [[[3, 32, 32, 1, True]], [[3, 32, 32, 1, False]], [[3, 32, 64, [2, 1], False]],
                                      [[3, 64, 64, [2, 1], False]]]},
    "pp_ocrv5_mobile_det": {"initializer_range": 0.2},
    "pp_ocrv5_server_det": _PPOCR_SERVER_NECK,
    "pp_ocrv6_medium_det": {**_PPOCR_SERVER_NECK, **_PPOCR_DET_BACKBONE},
    "pp_ocrv6_small_det": {**_PPOCR_DET_BACKBONE, "layer_list_out_channels": [32, 32, 64, 64],
                           "initializer_range": 0.2},
    # the sparse-attention indexer is sized by checkpoints only (defaults None); one key head, as it requires
    "qwen4_exp_text": _QWEN4_INDEXER,
    # its indexer pools keys by 16: the tiny prompt (11 tokens) completes none, the decode program is traced with
    # no pool and guarded on the length staying under 16, which generation passes. Pools of 4 (two in the prompt)
    # keep the pool count symbolic, as a real prompt of two pools or more does
    "glm5_next_text": {"index_kpool": 4},
    # its cache sizes heads from widths rounded up to 64 while its layers do not: widths that need no rounding
    "xlstm": {"hidden_size": 128, "embedding_dim": 128},
    # its patch_size is the crop each ViT sees, which must be the ViTs' image size, and fit a quarter of the image;
    # the hooks read hidden states of layers a two-layer ViT has
    "depth_pro": {"patch_size": 8, "intermediate_hook_ids": [1, 0], "intermediate_feature_dims": [16, 16],
                  "scaled_images_feature_dims": [32, 32, 16],
                  **{f"{vit}_model_config.{key}": value
                     for vit in ("image", "patch", "fov") for key, value in (("image_size", 8), ("patch_size", 4))}},
    # the vision MLP and the projector read the pixel-shuffled patches (hidden / ratio**2 wide), and the adapter
    # maps projector_input_dim back to projector_output_dim, which must be equal
    "llama4_vision_model": {"intermediate_size": 128, "projector_input_dim": 32},
    # a tiny context: the chunked attention bounds the sequence below its chunk (8,192 tokens), and ExecuTorch plans
    # the attention scores for that bound (34 GB each at a batch of 32: bad_alloc at load)
    "llama4_text": {"attention_chunk_size": 32},
    "llama4": {"text_config.attention_chunk_size": 32},
    # the adapter reads merge x merge vision patches folded into channels: out_hidden_size is 4x the vision width
    "muse_glimmer": {"out_hidden_size": 128},
    "muse_spark": {"out_hidden_size": 128},
    # the mask head takes the hidden states and one attention map per head stacked, a multiple of 8 channels
    "detr": {"encoder_attention_heads": 8},
    # cross-attention keys are the pixels with hard-coded Fourier features (261 or 322 channels): one head divides;
    # the latent array's names escape the generic shrink (256 latents x 1280 wide, 26 self-attention layers); optical
    # flow decodes a flow vector per pixel of train_size (368 x 496); multimodal autoencoding reads num_frames of
    # audio_samples_per_frame each (16 x 1920). Its optical flow faded to 3e-4 at init scale 0.02 (within ONNX's and
    # ExecuTorch's tolerance of zero), 0.06 at 0.1
    "perceiver": {"num_cross_attention_heads": 1, "num_latents": 16, "d_latents": 32, "num_self_attends_per_block": 2,
                  "train_size": [8, 8], "num_frames": 2, "audio_samples_per_frame": 64, "initializer_range": 0.1},
    # text layers cross-attend to the image only at the listed indices (3, 8, …): one a two-layer model has; the
    # projector reads the last and five intermediate vision layers concatenated, 6 x 32 wide
    "mllama": {"text_config.cross_attention_layers": [1], "vision_config.vision_output_dim": 192},
    # checkpoint-only settings (None by default) that the modules are built from:
    # image tokens reach the text through a vocabulary map of "IMGIMG<code in letters>Z" names: a 16-entry codebook
    # mapped onto ids of the tiny vocabulary
    "chameleon": {"vq_config.num_embeddings": 16, "image_token_id": 100,
                  "vocabulary_map": {"<image>": 100, **{f"IMGIMG{str(code).translate(_DIGITS_AS_LETTERS)}Z": 101 + code
                                                        for code in range(16)}}},
    "deepseek_ocr2": {"text_config.mlp_layer_types": ["dense", "sparse"]},  # one dense and one expert layer
    "diffusion_gemma": {"text_config.num_experts": 4, "text_config.top_k_experts": 2},
    # the matting head's upsampling and refinement channels
    "sapiens2": {"head_config.upsample_out_channels": [16, 16], "head_config.upsample_kernel_sizes": [4, 4],
                 "head_config.conv_out_channels": [16], "head_config.conv_kernel_sizes": [1]},
    # its rotary covers half the head (partial_rotary_factor 0.5): the sections split that half's frequencies
    "glm4v_moe_text": {"rope_parameters.mrope_section": [1, 1, 0]},
    # the safety verdict reads the logits of "Yes" and "No" at their checkpoint ids: ids of the tiny vocabulary
    "shieldgemma2": {"yes_token_index": 10, "no_token_index": 11},
    # its detail branch downsamples the image to 1/8 and fuses it with the 1/16 ViT features upsampled once
    "vitmatte": {"backbone_config.patch_size": 16},
    # its sliding-attention layers take their sizes from full-size defaults of its own (swa_*) unless given per layer
    "dots3_note_text": {"per_layer_config": {1: {
        "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 16, "kv_lora_rank": 16, "head_dim": 16,
        "qk_nope_head_dim": 8, "v_head_dim": 8, "qk_rope_head_dim": 8}}},
    # the audio adapter reads the audio encoder's states: its input width is the encoder's (checked by the config)
    "dots3_note_audio_encoder": {"adapter_input_size": 32},
    # the adapter reads vision layers 24 and 18: the two layers a tiny tower has
    "molmo2": {"adapter_config.vision_feature_layer": [-1, -2]},
    "molmo2_vision": {"num_position_embeddings": 16},  # one per patch of the tiny image (4 x 4)
    # image_size / num_windows must be divisible by sqrt(num_windows)
    "lw_detr_vit": {"num_windows": 4},
    # the backbone's features reach the decoder through one projector per scale, which checkpoints list (none by
    # default): one, at the backbone's own scale
    "lw_detr": {"projector_scale_factors": [1.0]},
    # no layer_types and no full_attn_idxs by default: the model cannot tell its layers apart
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},
    # each stage indexes its own drop-path list by stage number: the last stage needs 3 blocks
    "cvt": {"depth": [1, 2, 3]},
    # the spatial embedding is 4 coordinate + 2 shape embeddings, which must add up to the hidden size
    "layoutlmv2": {"coordinate_size": 4, "shape_size": 8},
    "layoutlmv3": {"coordinate_size": 4, "shape_size": 8, "input_size": 32},
    # a shared transformer block every other layer: two of them are needed for its tied weights; it attends over
    # the hidden state and the embeddings side by side, twice the width
    "zamba": {"num_hidden_layers": 4, "layers_block_type": ["linear_attention", "hybrid"] * 2,
              "attention_hidden_size": 64, "attention_head_dim": 16, "mamba_dt_rank": 4},
    # output stride 32: a 32-pixel image leaves nothing for the transformer blocks to mix
    # its stages keep the resolution (no patch merging), which the rule for halving stages takes for six halvings
    # (256 pixels): two stages, two windows of 8 a side
    "swin2sr": {"image_size": 16, "depths": [1, 1], "num_heads": [4, 4]},
    # prompt and input merge before the first output it keeps (the shrink puts outputs at layers 0 to 3); its canvas
    # holds the example image above the image: twice as high as wide
    "seggpt": {"merge_index": 0, "image_size": [64, 32]},
    # the full T5Gemma 2 config hands its dropout rate down to the encoder's text config; alone, nothing does
    "t5gemma2_encoder": {"text_config.dropout_rate": 0.0},
    # its atom encoders' 3-d rotary needs 3 × spatial + uid frequency pairs within half a (now 8-wide) head
    # and its single-residue inputs are the atom encoding beside two residue-type one-hots and a flag
    "esmfold2": {"single_inputs_size": 32 + 2 * 33 + 1,
                 "atom_encoder.num_spatial_rope_pairs_per_axis": 1, "atom_encoder.num_uid_rope_pairs": 1,
                 "structure_head.diffusion_module.atom_encoder.num_spatial_rope_pairs_per_axis": 1,
                 "structure_head.diffusion_module.atom_encoder.num_uid_rope_pairs": 1},
    "mobilevit": {"image_size": 64},
    # its channels double at each of four downsamplings: from 4, its LSTM is 64 wide, not 512
    "encodec": {"num_filters": 4},
    # the text models alone: their layer kinds and expert counts are set by the composite configs around them
    "deepseek_ocr2_text": {"mlp_layer_types": ["dense", "sparse"]},
    "diffusion_gemma_text": {"num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 32},
    # a Swin tower: its output is the patch width doubled per stage after the first (two stages here)
    "clap_audio_model": {"hidden_size": 64},
    # its six upsampling stages halve the channels each: 128 leaves 2 at the end. Its 40-odd unnormed convolutions
    # multiply the init scale's gain: at 0.02 the waveform is 7e-7 (below any parity tolerance: every program would
    # match it), at 0.08 it saturates at ±1; at 0.07 it spreads with std 0.16
    "qwen2_5_omni_bigvgan": {"upsample_initial_channel": 128, "initializer_range": 0.07},
    # its codes are as wide as its two encoders side by side, which the config derives when left unset
    "xcodec": {"codebook_dim": None},
    # ESMFold's trunk (its config exists only for the folding class) at widths its heads divide: 32 M weights
    # otherwise, 0.3 M with these
    "esm": {"esmfold_config.trunk.sequence_state_dim": 64, "esmfold_config.trunk.pairwise_state_dim": 32,
            "esmfold_config.trunk.max_recycles": 1, "esmfold_config.lddt_head_hid_dim": 32,
            "esmfold_config.trunk.structure_module.sequence_dim": 32,
            "esmfold_config.trunk.structure_module.pairwise_dim": 32,
            "esmfold_config.trunk.structure_module.resnet_dim": 32,
            "esmfold_config.trunk.structure_module.num_heads_ipa": 2},
    # its quantizer reads the codec's and the semantic encoder's widths together (1024 + 1024 in checkpoints);
    # encoder channels double at each of its five downsampling stages: start narrow (15M weights at 48). At init
    # scale 0.02 its 20-odd unnormed convolutions shrink the audio to 1e-7 and every latent rounds to the middle
    # level of its scalar quantizer (one code for any input); at 0.1 both encoders hand over states of about one
    "xcodec2": {"quantization_dim": 64, "encoder_hidden_size": 4, "initializer_range": 0.1},
    # the retrieval and text-projection heads read text through the Q-Former, as their checkpoints set (the other
    # classes never feed it text)
    "blip-2": {"qformer_config.use_qformer_text_input": True},
    # the vocoder reads the spectrogram FastSpeech 2 makes, num_mel_bins (80) wide
    "fastspeech2_conformer_hifigan": {"model_in_dim": 80, "initializer_range": 0.1},
    # the mask head reads the width plus one channel per attention head, in groups of 8
    "conditional_detr": {"encoder_attention_heads": 8, "decoder_attention_heads": 8},
    # the projection after its two halving convolutions reads channels[0] // 4 mel bins: the first is as wide as
    # the 64 bins fed
    "gemma4_audio": {"subsampling_conv_channels": [64, 32]},
    # its rotary table is at least 32 wide, and must cover a whole head
    "clvp_encoder": {"num_attention_heads": 1},
    # its frame prompter pads each frame to max_img_size, a band of visual_prompt_size on each side; the grid is
    # max-pooled after the backbone, which must leave more than one cell of a 32-pixel frame
    "tvp": {"max_img_size": 32, "visual_prompt_size": 4, "backbone_config.out_features": ["stage2"],
            "backbone_config.out_indices": [2]},
    # the image embedding is the last stage's channels times width_coefficient, and must be projection_dim wide
    "align": {"vision_config.width_coefficient": 1.0},
    "mobilevitv2": {"image_size": 64},
    # attention biases are sized from image_size / 16 and the 16-pixel patch embedding
    "levit": {"patch_size": 16, "image_size": 64},
    # axial position embeddings: the two dims sum to hidden_size, the shape multiplies to the positions
    "reformer": {"axial_pos_embds_dim": [16, 16], "axial_pos_shape": [8, 16], "lsh_attn_chunk_length": 4,
                 "local_attn_chunk_length": 4, "hash_seed": 0},
    # its last convolution is sized round_filters(1280) by the code: width and hidden_dim must agree with it
    "efficientnet": {"width_coefficient": 0.25, "depth_coefficient": 0.5, "hidden_dim": 320,
                     "in_channels": [32, 16, 24, 40, 80, 112, 192], "out_channels": [16, 24, 40, 80, 112, 192, 320]},
    # the projector maps a known patch count to a query count: 16 patches of a tiny image to 4 queries
    "aria": {"projector_patch_to_query_dict": {16: 4}},
    # expert counts default to None (checkpoints set them), which the experts' weight shapes cannot take
    "dots1": {"n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2},
    # the attention reads rope_theta and clip_qkv from attn_config, where checkpoints keep them; defaults have none
    "dbrx": {"attn_config.rope_theta": 10000.0, "attn_config.clip_qkv": 8.0},
    # num_hidden_layers counts cache slots (per stack x cycles), derived from the per-stack count when that is unset
    "hrm_text": {"num_layers_per_stack": None},
    # box position widths derived from the width (a quarter, split over 8 coordinates) must come out even
    "bros": {"hidden_size": 64},
    # its vision attention has a head per 64 channels, and the cross-modal layers join the two widths; its contrastive
    # head reads a width and a logit scale its config does not declare (CLIP's 2.6592)
    "bridgetower": {"text_config.hidden_size": 64, "vision_config.hidden_size": 64, "hidden_size": 64,
                    "contrastive_hidden_size": 32, "logit_scale_init_value": 2.6592},
    # the decoder reads these vision layers, counted in the vision config the fitting does not see from here
    "clipseg": {"extract_layers": [0, 1]},
    # its query projection reads mask features of the decoder's width
    "oneformer": {"mask_dim": 32},
    # its kernel predictor emits a hidden x hidden kernel per layer and step: 7 M weights at 32 channels
    "univnet": {"model_hidden_channels": 8},
    # its durations and latents draw noise scaled by these: at zero the speech is the same on every call
    "vits": {"noise_scale": 0.0, "noise_scale_duration": 0.0},
    # its decoder reads key/value heads its config does not declare: unset, they are as many as the query heads
    "moonshine_streaming": {"num_key_value_heads": None},
    # the depth head's bottleneck is a fixed 256 channels unless said otherwise; at the default init scale the
    # signal fades through its dozens of convolutions until the depth no longer depends on the image; at 0.2 it grows
    # into the thousands, where float rounding summed in another order by an export exceeds the parity tolerance
    # and its BEiT backbone feeds the stages after the stem, which the beit row's fitted indices would include
    "zoedepth": {"bottleneck_features": 32, "initializer_range": 0.14, "backbone_config.out_indices": [1, 2, 3, 4],
                 "backbone_config.out_features": ["stage1", "stage2", "stage3", "stage4"]},
    # the last layers read keys and values shared from earlier ones: with two layers, none may share
    "gemma3n_text": {"num_kv_shared_layers": 0},
    # one rotary setting per attention kind, which the empty default does not give
    "cohere_compass_text": {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    # any-resolution models tile an image on a grid of pinpoints: one tile the size of the tiny image
    "llava_next": {"image_grid_pinpoints": [[32, 32]]},
    "llava_next_video": {"image_grid_pinpoints": [[32, 32]]},
    "llava_onevision": {"image_grid_pinpoints": [[32, 32]]},
    # also: its Q-Former has one head per 64 vision channels; checkpoints name the window downsampling and the
    # vision layers injected into text layers (layers a two-layer model has)
    "granite4_vision": {"image_grid_pinpoints": [[32, 32]], "vision_config.hidden_size": 64, "downsample_rate": "1/2",
                        "deepstack_layer_map": [[-1, 0], [-2, 1]], "spatial_target_layers": [0, 1, 0, 1]},
    # feature map sizes of a 1024-pixel image at strides 4, 8 and 16: those of the tiny one instead
    # and Hiera pools the skip connection only where the width changes: the stage widths must keep doubling,
    # and the neck reads them in reverse
    "sam2_vision_model": _HIERA_STAGES,
    # the prompt encoder's grid (image / patch) is the 16x-downsampled feature map
    "sam2": {"prompt_encoder_config.patch_size": 16},
    "sam2_video": {"prompt_encoder_config.patch_size": 16},
    # the codec's channels double at each of its four downsampling stages: start narrow (5.7 M weights at 32)
    "mimi": {"num_filters": 4},
    # MusicGen's EnCodec (14 M weights at 32) turns generated codes into sound, outside the forward; EnCodec alone
    # keeps its width, below which its codes stop moving with the audio
    "musicgen": {"audio_encoder.num_filters": 4},
    "musicgen_melody": {"audio_encoder.num_filters": 4},
    # and VibeVoice's tokenizers' at each of six (86 M weights each at 32); at init scale 0.02 its halves' outputs
    # fade to 1e-9 (vanishing: any program matches), at 0.1 they are about 0.2
    "vibevoice_acoustic_tokenizer": {"num_filters": 2, "initializer_range": 0.1},
    "vibevoice_acoustic_tokenizer_encoder": {"num_filters": 2, "initializer_range": 0.1},
    "vibevoice_acoustic_tokenizer_decoder": {"num_filters": 2, "initializer_range": 0.1},
    # outputs that fade at init scale 0.02, and at 0.1: DPT's depth 6e-8 / 0.1, UniSpeech-SAT's x-vector 6e-7 / 0.06,
    # Molmo 2's adapter 6e-7 / 0.05
    "dpt": {"initializer_range": 0.1},
    "unispeech-sat": {"initializer_range": 0.1},
    "molmo2_adapter": {"initializer_range": 0.1},
    # and the rest of the eager screen of every class (max |output| at 0.02 / at 0.1): the x-vector heads of the
    # wav2vec 2 family ~6e-7 / 0.06 (five TDNN layers and two projections, no norm), SEW and SEW-D's pooled
    # classifiers 7e-4 / 0.14, Depth Anything's depth 5e-6 / 0.5, MobileBERT's classifiers 2.5e-4 / 0.19 (its
    # NoNorm only scales), PatchTSMixer's heads 8e-4 / 0.1, the HiFi-GAN vocoders 3e-6 / 0.05, FLAVA's image
    # codebook 9e-4 / 3, VibeVoice's whole acoustic tokenizer 9e-8 / 0.04
    **dict.fromkeys(("wav2vec2", "wav2vec2-bert", "wav2vec2-conformer", "data2vec-audio", "wavlm", "sew", "sew-d",
                     "mobilebert", "speecht5_hifigan", "flava_image_codebook"), {"initializer_range": 0.1}),
    **dict.fromkeys(("depth_anything", "prompt_depth_anything"),
                    {"initializer_range": 0.1, "backbone_config.initializer_range": 0.1}),
    # SAM 3's ViT grid (a 32-pixel image in 8-pixel patches) scaled by 4, 2 and 1
    "sam3_vision_model": {"backbone_feature_sizes": [[16, 16], [8, 8], [4, 4]]},
    "sam2_hiera_det_model": {key.removeprefix("backbone_config."): value for key, value in _HIERA_STAGES.items()
                             if key.startswith("backbone_config.")},
    # image tokens reach the text model through a vocabulary map that ships with the checkpoint: 16 codebook
    # entries mapped onto ids of the tiny vocabulary instead; the VQ attention is sized hidden_size, which must
    # equal the last stage's channels (base x multiplier)
    "emu3": {"vq_config.codebook_size": 16, "vq_config.channel_multiplier": [1, 1, 1, 1], "image_token_id": 100,
             "vocabulary_map": {"<image>": 100, "<|extra_200|>": 101,
                                **{f"<|visual token {index:06d}|>": 102 + index for index in range(16)}}},
    # its speech decoder prenet drops out in eval mode too (by design, for variety): no randomness in a parity test
    "speecht5": {"speech_decoder_prenet_dropout": 0.0},
    # its layer norms read a timm backbone's channels-last maps; the ResNet that stands in for timm here gives the
    # channels-first maps its encoder reads. Its decoder projects the task's text states only when they are narrower
    # than itself (it has no projection otherwise, which it calls anyway): a text model half its width
    "omdet-turbo": {"apply_layernorm_after_vision_backbone": False, "text_config.hidden_size": 16,
                    "class_embed_dim": 16, "text_projection_in_dim": 16, "text_projection_out_dim": 16},
    # its decoder lays the codes on a num_patches-square grid: the encoder's grid of the tiny image (2 x 2)
    "janus_vqgan": {"num_patches": 2},
    # channels are spelled out per layer (128 wide: 8 M weights): (in, out, dilation, downsample) per ResNet layer,
    # (channels, dilation) per bridge block
    "uvdoc_backbone": {
        "resnet_head": [[3, 8], [8, 8]],
        "resnet_configs": [[[8, 8, 1, False]], [[8, 16, 1, True]], [[16, 16, 1, True], [16, 16, 3, False]]],
        "stage_configs": [[[16, 1]], [[16, 2]], [[16, 5]], [[16, 8], [16, 3]], [[16, 12], [16, 7]],
                          [[16, 18], [16, 6]]],
    },
    # the head fuses every bridge stage's map, as checkpoints list them (the default keeps the last stage only), and
    # reflect-pads it by 2: the image must leave more than 2 x 2 of it
    "uvdoc": {"backbone_config.out_features": [f"stage{index}" for index in range(1, 7)],
              "backbone_config.out_indices": list(range(1, 7)), "image_size": 48,
              "bridge_connector": [16, 16], "out_point_positions2D": [[16, 8], [8, 2]]},
    # the images-and-text head sizes its classifier by the images per sample (-1 until a checkpoint sets it; NLVR2
    # pairs two): one, as the other heads are fed
    "vilt": {"num_images": 1},
    # pre-training masks random patches, in eval mode too; forecast masking hides the last patches of every series
    # (it shuffles the rows, which all get the same mask)
    "patchtst": {"mask_type": "forecast", "num_forecast_mask_patches": 2},
    "patchtsmixer": {"mask_type": "forecast", "num_forecast_mask_patches": 2, "init_std": 0.1},
    # its text model builds a sliding-window mask whatever its layer types say: the window must be set
    "step3p7": {"text_config.sliding_window": 64},
    "step3p5": {"sliding_window": 64},
    # five vision layers' features are concatenated, picked down to layer -11: five that a 2-layer tower has
    "vipllava": {"vision_feature_layers": [-2, -3, 0, 1, 2]},
    # per-class detection thresholds and reading order ship with checkpoints (None by default): one per tiny label
    "pp_doclayout_v2": {"class_thresholds": [0.5, 0.5], "class_order": [0, 1], **_DETR_SIGNAL},
    "d_fine": _DETR_SIGNAL,  # and the rest of the family (PP-DocLayoutV3 below)
    "deimv2": _DETR_SIGNAL,
    "pp_doclayout_v4": _DETR_SIGNAL,
    # its depth head normalises relu'd bin logits with a 1e-8 shift: at the default init scale the logits are as
    # small as the shift (1e-7), and the depth turns on rounding
    "chmv2": {"initializer_range": 0.1},
    # its model builds its cache from the composite config, which has no num_hidden_layers (transformers 5.23
    # fails there in eager too; huggingface/transformers#47916 proposed a decoder alias and was closed unmerged):
    # the forward runs without one; its byte n-gram hash table has 500k rows per n
    "blt": {"use_cache": False, "encoder_hash_byte_group_vocab": 64},
    # the quantizer reads the concatenated acoustic and semantic states: its width is their sum; X-Codec 2's encoder
    # and init scale (above)
    "neucodec": {"quantization_dim": 64, "encoder_hidden_size": 4, "initializer_range": 0.1},
    # the text config alone lacks the initializer_range its weight init reads (the composite config carries it)
    "pix2struct_text_model": {"initializer_range": 0.02},
    # encoder channels double at each of its four downsampling stages: start narrow, or it alone has 5M weights
    "dac": {"encoder_hidden_size": 8},
    # text-line recognisers downsample the height 16x (server) to 32x and more (mobile): the tiny square image
    # leaves nothing to pool
    # (and at the default init scale the text-line signal fades to nothing before the head)
    "pp_ocrv5_mobile_rec": {"image_size": [96, 64], "initializer_range": 0.2},
    "pp_ocrv5_server_rec": {"image_size": [48, 64], "initializer_range": 0.2},
    "pp_ocrv6_small_rec": {"image_size": [48, 64], "initializer_range": 0.2},
    "pp_ocrv6_tiny_rec": {"image_size": [48, 64], "initializer_range": 0.2,  # its PP-LCNet v4 backbone too
                          "backbone_config.initializer_range": 0.2},
    # at the default init scale its PP-LCNet backbone fades the image out (1e-36 after its last stage; 1e-9 at 0.2,
    # and 1e6 at 0.5); its table head decodes up to max_text_length + 1 steps (501), each a block of the traced graph
    "slanet": {"initializer_range": 0.2, "backbone_config.initializer_range": 0.35, "max_text_length": 8},
    "slanext": {"max_text_length": 8},  # the same table head
    # the flow head is conditioned on the backbone's hidden states: same width (checked by the config)
    "gradium_phonon_tts": {"flow_head_config.condition_dim": 32},
    "pocket_tts": {"flow_head_config.condition_dim": 32},
    # the adaptor's bottleneck is a quarter of the text width (checked by the config)
    "fun_asr_nano": {"adaptor_config.intermediate_size": 8},
    # the projector reads 4 encoder frames folded into one (a merge factor the code fixes at 4)
    "glmasr_encoder": {"intermediate_size": 128},
    # SuperGlue matches the detector's descriptors at its own hidden width; at the default init scale its pixel
    # scores are all 1/65 to 1e-5, and which pixels survive non-maximum suppression is down to rounding (ONNX Runtime
    # kept 38 keypoints of eager's 45): at 0.1 they spread from 0 to 0.08
    "superpoint": {"descriptor_decoder_dim": 32, "initializer_range": 0.1},
    # SuperGlue's optimal transport unrolls its Sinkhorn iterations into the graph: at 100, to_edge took 530 s of
    # ExecuTorch's 600 (torch.export 29 s); three iterations are the same ops
    "superglue": {"sinkhorn_iterations": 3},
    # the prompt's sine position features (2 x num_pos_feats) are added to the image embedding
    "sam_vision_model": {"num_pos_feats": 16},
    "sam_hq_vision_model": {"num_pos_feats": 16},
    "sam_hq_mask_decoder": {"vit_dim": 32},  # the width of the ViT features the HQ head reads
    # its shared expert is sized by a key that checkpoints carry and the config class does not declare
    "qwen3_omni_moe_talker_text": {"shared_expert_intermediate_size": 64},
    # the talker reads a merge size that checkpoints carry and its config class (no model type) does not declare
    "qwen3_omni_moe": {"talker_config.spatial_merge_size": 2},
    # the omni thinkers' rope index reads a vision start token their configs do not define
    "qwen2_5_omni_thinker": {"vision_start_token_id": 151652},
    "qwen3_omni_moe_thinker": {"vision_start_token_id": 151652},
    # the two M-RoPE axes take rotated dimensions in fours, of which a quarter of an 8-wide head has too few:
    # two heads, 16 wide
    "neomme": {"num_attention_heads": 2, "num_key_value_heads": 2},
    # per-stage, per-block channel lists that must chain into each other and end at hidden_size: one block a stage;
    "efficientloftr": {"stage_num_blocks": [1, 1, 1, 1], "out_features": [8, 8, 16, 32], "hidden_size": 32,
                       "stage_in_channels": [1, 8, 8, 16], "stage_block_stride": [[2], [1], [2], [2]],
                       "stage_block_out_channels": [[8], [8], [16], [32]],
                       "stage_block_in_channels": [[1], [8], [8], [16]], "fine_fusion_dims": [32, 16, 8],
                       # its 2-D rotary table fills hidden_size / 4 slots: heads / 2 = partial_rotary_factor (4)
                       "num_attention_heads": 8, "num_key_value_heads": 8,
                       # it gathers a fine window's offsets along the keypoint axis: a window no larger than the
                       # tiny image's 16 keypoints (checkpoints have thousands of keypoints for 64 window cells)
                       "fine_kernel_size": 4,
                       # fine matching slices this many channels off the finest (8-wide) features
                       "fine_matching_slice_dim": 4,
                       # the 2-cell border it drops is the whole 4x4 coarse grid of a tiny image, and a random
                       # model's match confidences stay under the checkpoint threshold: no match would be left
                       "coarse_matching_border_removal": 0, "coarse_matching_threshold": 0.0},
    # the segmentation head reads four layers' features (checkpoints: [3, 5, 7, 11]); the default lists the last only
    "beit": {"num_hidden_layers": 4, "out_indices": [1, 2, 3, 4]},
    # the layout embedding is six position embeddings of hidden_size // 6 each, which must add up to hidden_size
    # and divide by channel_shrink_ratio (4)
    "lilt": {"hidden_size": 48},
    # the pre-training decoder is sized by checkpoints only (defaults None); it masks whole 8x8-token units, of
    # which a 32-pixel image (8x8 tokens) has one: the mask ratio would leave nothing visible
    "hiera": {"decoder_hidden_size": 32, "decoder_depth": 1, "decoder_num_heads": 1, "image_size": [64, 64]},
    # the mask branch reads the backbone's first-stage features, whose width it assumes (128)
    "pp_doclayout_v3": {"x4_feat_dim": 32, **_DETR_SIGNAL},
}

# model class -> the config class it is built from, where it declares its composite's: the class that builds it
# hands it a sub-config (UVDoc's bridge is built by its backbone)
BUILT_FROM: dict[str, str] = {
    "UVDocBridge": "UVDocBackboneConfig",
}

# model type -> feature extractor class, where the auto mapping names one that does not make this model's inputs.
FEATURE_EXTRACTOR_OVERRIDES: dict[str, str] = {
    "wav2vec2-bert": "SeamlessM4TFeatureExtractor",  # mapped to Wav2Vec2's raw-audio extractor; takes stacked mels
    "neucodec": "SeamlessM4TFeatureExtractor",  # its semantic encoder is a wav2vec2-bert
    "clap_audio_model": "ClapFeatureExtractor",  # the audio tower alone, fed as CLAP feeds it
    # Qwen omni thinkers: their processors' Whisper extractor (no mapping of their own)
    "qwen2_5_omni_thinker": "WhisperFeatureExtractor",
    "qwen3_omni_moe_thinker": "WhisperFeatureExtractor",
    "qwen3_asr_encoder": "Qwen3ASRFeatureExtractor",  # the encoder alone, fed as its model feeds it
}

# model type -> mel frames per text token, for models that add the audio to every text position instead of
# placeholders: the two lengths must agree.
AUDIO_FRAMES_PER_TOKEN: dict[str, int] = {
    "voxtral_realtime": 8,  # a stride-2 convolution, then 4 frames merged per token (downsample_factor)
}

# model type -> the number of mel frames must be a multiple of this (the extractor's are cut down to one)
AUDIO_FRAME_MULTIPLES: dict[str, int] = {
    "glmasr": 8,  # a stride-2 convolution, then 4 frames merged into one token
    "nemo_speechlm": 8,  # its encoder subsamples by 8 (subsampling_factor) and asks for whole steps
}

# model types that run one sample at a time: the inputs of both sets have a batch of 1 (their lengths still differ)
ONE_SAMPLE_BATCH: set[str] = {
    "tvp",  # views its column position embeddings at (batch, 1, width, hidden): a batch of 2 has twice too few
}

# model type -> channels of its raw audio, where neither its config nor its forward docstring says (the layout is
# then batch x channels x samples)
RAW_AUDIO_CHANNELS: dict[str, int] = {
    "vibevoice_asr": 1,  # its tokenizers convolve (batch, 1, samples); its docstring says (batch, samples)
    "vibevoice": 1,  # and VibeVoice's own, and theirs alone
    "vibevoice_acoustic_tokenizer": 1,
    "pe_audio": 1,  # its codec encoder convolves (batch, 1, samples)
    "pe_audio_encoder": 1,
    "xcodec": 1,  # refuses anything but mono (batch, 1, samples)
}

# model type -> how it takes pixels, where its forward signature does not say: "patches" (flattened patches,
# batch x patches x C*P*P) or "images" (a list of images per sample, batch x 1 x C x H x W, with a pixel mask).
PIXEL_LAYOUTS: dict[str, str] = {
    "fuyu": "patches",  # a linear layer over raw patches instead of a vision tower
    "gemma4_vision": "patches",  # the same, each patch with its grid position
    "diffusion_gemma": "patches",  # its encoder's Gemma 4 tower
    "neomme": "flat-patches",  # the batch's patches in one list, patches x C*P*P
    # any-resolution: the base image and its tiles, batch x (1 + tiles) x C x H x W
    "llava_next": "tiles",
    "llava_next_video": "tiles",
    "llava_onevision": "tiles",
    "granite4_vision": "tiles",
    "efficientloftr": "pairs",  # its backbone too reads image pairs, batch x 2 x C x H x W
    "seggpt": "half-canvas",  # its example image stacked above the image fill its configured canvas
    "tvp": "video",  # its frames, batch x frames x C x H x W
    "xclip": "video",  # a clip of num_frames images, batch x frames x C x H x W
    "xclip_vision_model": "flat-video",  # the same clips, their frames flattened into the batch
    "colmodernvbert": "images",  # ModernVBert's images, whose pixel mask the wrapper's forward does not name
    "colqwen2": "padded-patches",  # its processor pads each image's patches to a row: images x patches x C*T*P*P
    # a list of images per sample whose pixel_attention_mask flags the real images (tiles), batch x 1
    "molmo2": "patches",  # one crop per image, its patches flattened: batch x patches x C*P*P
    "molmo2_vision": "patches",
    "granite_docling": "flagged-images",
    "pi0": "flagged-images",  # one image per camera, flagged present
    # one image cut in up to max_num_tiles tiles, batch x 1 x tiles x C x H x W; here a 1:1 image in one tile
    "mllama": "image-tiles",
    "mllama_vision_model": "image-tiles",
    # grid patches each as a small image, rows x C x P x P (with a leading batch of 1 for PaddleOCR's tower alone)
    "kimi_k25": "grid-images",
    "kimi_k25_vision": "grid-images",
    "paddleocr_vl": "grid-images",
    "paddleocr_vl_vision": "batched-grid-images",
    # patches each as a short channels-last clip, patches x temporal_patch_size x P x P x C, one token each
    "inkling_mm_model": "patch-clips",
    "inkling_vision": "patch-clips",
    # grid images cut in merge x merge blocks of patches, each block channels-last: blocks x M*P x M*P x C
    "inkling2": "merged-blocks",
    "inkling2_vision": "merged-blocks",
    # every image's patches side by side in one strip, 1 x C x P x (images * patches * P), with target_sizes
    "minicpmv4_6": "packed",
    "minicpmv4_7": "packed",
    "minicpm_ocr": "packed",
    "minicpm_ocr_vision": "packed",
    "minicpmv4_7_vision": "packed",
}

# model class -> the input its forward really starts from, where main_input_name says otherwise; it is fed alone
# (no token ids beside it)
MAIN_INPUTS: dict[str, str] = {
    # its encoder refuses token ids: it reads the text model's states
    "SeamlessM4TTextToUnitModel": "inputs_embeds",
    "SeamlessM4TTextToUnitForConditionalGeneration": "inputs_embeds",
    # Qwen3-Omni's talker reads the thinker's states (it has no embedding table), and its code predictor, prefilled,
    # the talker's
    "Qwen3OmniMoeTalkerModel": "inputs_embeds",
    "Qwen3OmniMoeTalkerCodePredictorModel": "inputs_embeds",
    "Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration": "inputs_embeds",
    "Pop2PianoForConditionalGeneration": "input_features",  # its encoder reads the audio features in place of tokens
    "SpeechEncoderDecoderModel": "input_values",  # its default encoder is a wav2vec2: raw samples
    # text or speech in, one attention mask for whichever it is: speech, as its speech-to-text sibling is fed
    "SeamlessM4TModel": "input_features",
    "SeamlessM4Tv2Model": "input_features",
}

# model class -> {"atol": ..., "rtol": ..., "backends": [...], "reason": ...}: a tolerance wider than the default,
# shown on the dashboard next to every cell it applies to.
TOLERANCE_OVERRIDES: dict[str, dict] = {}

# dtype -> (atol = rtol, why): parity of a half-precision cell. Eager runs in that dtype too, so what is left is the
# rounding of a different order of operations (fused kernels, XNNPACK's accumulation), a few units in the last place
# of the outputs' magnitude. float32 keeps each backend's default.
DTYPE_TOLERANCE: dict[str, tuple[float, str]] = {
    "float16": (1.6e-2, "float16 keeps 10 mantissa bits (a unit in the last place is 1e-3 at 1): half-precision "
                        "exporters customarily compare at 1.6e-2"),
    "bfloat16": (1.6e-2 * 8, "bfloat16 keeps 7 mantissa bits, 8 times coarser than float16 (a unit in the last "
                             "place is 7.8e-3 at 1): the float16 tolerance scaled by the same factor"),
}  # fmt: skip

# Where a half-precision program differs from eager in its dtype beyond that tolerance, it still passes if it strays
# from eager's float32 outputs no further than this many times eager's own half-precision error (an overflow-free
# one): deep convolutional and audio stacks round differently at every layer, and XNNPACK's or ONNX Runtime's order
# of sums is no worse than eager's, only another. Two independent roundings differ by up to twice either's error.
HALF_ERROR_MARGIN = 2.0
