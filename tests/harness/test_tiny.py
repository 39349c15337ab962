"""Tiny configs and inputs: a spread of model kinds builds and runs eager, with the inputs each kind needs."""

import pytest
import torch

from harness.cells import ClassContext
from harness.inputs import make_inputs
from harness.models import select
from harness.tiny import VOCAB, WIDTH, tiny_config

KINDS = {
    "LlamaForCausalLM": "text",
    "BertForMultipleChoice": "text",
    "BartForSequenceClassification": "text",
    "DeepseekV3ForCausalLM": "text",
    "ViTMAEModel": "image",
    "SwinForImageClassification": "image",
    "DetrModel": "image",
    "VideoMAEModel": "video",
    "Wav2Vec2ForCTC": "audio",
    "ParakeetForCTC": "audio",
    "WhisperForConditionalGeneration": "text+audio",
    "Qwen2VLForConditionalGeneration": "text+image",
    "LlavaForConditionalGeneration": "text+image",
    "VoxtralForConditionalGeneration": "text+audio",
    "LlavaNextForConditionalGeneration": "text+image",
    "PatchTSTForPrediction": "time-series",
    "EfficientNetModel": "image",  # norm scales near one, statistics measured: at 7e-30 the image was silent
    "MobileNetV1ForImageClassification": "image",  # batch norms measured on the image: logits of 1e-29 otherwise
    "Wav2Vec2ForXVector": "audio",  # init scale 0.1: its TDNN layers faded the embeddings to 6e-7 at 0.02
    "MobileBertForSequenceClassification": "text",  # init scale 0.1: logits of 2.5e-4 at 0.02 (NoNorm only scales)
    "Qwen3VLVisionModel": "image",  # flattened patches fed as hidden_states, with their grid
    "Florence2VisionBackbone": "image",  # an image fed as hidden_states
    "EfficientLoFTRModel": "image",  # image pairs; chained per-stage channels
    "VideoLlama3ForConditionalGeneration": "text+image",  # merge sizes beside the grid
    "DacModel": "audio",  # mono codec: (batch, 1, samples), as its docstring says
    "Gemma3nAudioEncoder": "audio",  # mel frames under its own name
    "GraniteSpeechForConditionalGeneration": "text+audio",  # no extractor here: as wide as the layer reading them
    "Qwen2AudioForConditionalGeneration": "text+audio",  # one audio placeholder, which the model expands
    "VoxtralRealtimeForConditionalGeneration": "text+audio",  # mel frames in step with the text
    "MiniCPMV4_6ForConditionalGeneration": "text+image",  # images packed in one strip, with target_sizes
    "Kimi_K25VisionModel": "image",  # grid patches as small images; a square position grid
    "PaddleOCRVLForConditionalGeneration": "text+image",  # rotary sections the model reads with its own default
    "Inkling2ForConditionalGeneration": "text+image",  # channels-last blocks of merged patches
    "T5Gemma2ForSequenceClassification": "text+image",  # placeholders counted by the encoder's image features
    "CohereCompassForConditionalGeneration": "text+image",  # placeholder ids fit a text config an override touched
    "Sam2VisionModel": "image",  # Hiera's stage widths keep doubling
    "ZoeDepthForDepthEstimation": "image",  # an init scale at which the image reaches the depth
    "PPDocLayoutV2ForObjectDetection": "image",  # class thresholds that only checkpoints carry
    "TimesFm2_5Model": "time-series",  # univariate (batch, time) series
    "Dots1ForCausalLM": "text",  # expert counts default to None
    "DbrxForCausalLM": "text",  # rotary base and qkv clip live in attn_config
    "Sapiens2Backbone": "image",  # key/value heads counted per layer
    "HrmTextForCausalLM": "text",  # cache slots derived from the per-stack layer count
    "SpeechT5ForTextToSpeech": "text",  # its prenet drops out in eval mode unless told not to
    "SeamlessM4TTextToUnitModel": "text",  # starts from embeddings, not token ids
    "InstructBlipVideoForConditionalGeneration": "text+video",  # clips under the name pixel_values
    "VipLlavaForConditionalGeneration": "text+image",  # the vision layers it concatenates exist in a tiny tower
    "Emu3ForCausalLM": "text",  # its model type's override names a VQ config its text-only config lacks
    "PPLCNetV4Backbone": "image",  # per-block channels nested in block_configs
    "DepthProForDepthEstimation": "image",  # its ViTs' image size is its crop size
    "CHMv2ForDepthEstimation": "image",  # a flag its defaults set on the backbone config survives the shrink
    "Qwen4ExpForCausalLM": "text",  # its text config's own row: the indexer sizes checkpoints carry
    "ZambaForCausalLM": "text",  # two shared blocks, attending over twice the width
    "xLSTMForCausalLM": "text",  # widths its cache need not round up
    "Llama4VisionModel": "image",  # its MLP and adapter read pixel-shuffled patches, 4x the width
    "MuseGlimmerForConditionalGeneration": "text+image",  # merged patches folded into channels
    "DetrForSegmentation": "image",  # the mask head stacks hidden states and one map per head: a multiple of 8
    "PerceiverForImageClassificationFourier": "image",  # hard-coded Fourier features; a latent array named its own way
    "Kosmos2ForConditionalGeneration": "text+image",  # the text positions its latent image queries take
    "Pix2StructForConditionalGeneration": "text+image",  # flattened patches led by their grid row and column
    "MllamaForConditionalGeneration": "text+image",  # a tiled image, cross-attended from a layer the tiny model has
    "NemotronH_Omni_Reasoning_V3": "text+image",  # patch grids as (rows, columns)
    "DeepseekVLHybridForConditionalGeneration": "text+image",  # the image again for its high-resolution tower
    "ChameleonForConditionalGeneration": "text+image",  # image codes reach the text through a vocabulary map
    "DeepseekOcr2ForConditionalGeneration": "text+image",  # a SAM encoder whose default init scale is 1e-10
    "DiffusionGemmaForBlockDiffusion": "text",  # a canvas fed, not drawn at random
    "Sapiens2ForImageMatting": "image",  # head channels only checkpoints carry
    "Glm4vMoeForConditionalGeneration": "text+image",  # rotary sections of a half-rotary head
    "ShieldGemma2ForImageClassification": "text+image",  # its verdict token ids inside the tiny vocabulary
    "VitMatteForImageMatting": "image",  # its ViT's 16-pixel patches, as its detail branch expects
    "GraniteDoclingForConditionalGeneration": "text+image",  # a mask of real tiles, not of pixels
    "InklingForConditionalGeneration": "text+image",  # patches as short channels-last clips
    "Dots3NoteForConditionalGeneration": "text+audio+image",  # audio chunk lengths; sliding layers sized per layer
    "SamModel": "image",  # prompt position features as wide as the image embedding
    "SamHQModel": "image",  # its HQ head reads ViT features of the tiny width
    "Sam3TrackerModel": "image",  # feature map sizes of the tiny image
    "SuperGlueForKeypointMatching": "image",  # the detector's descriptors at the matcher's width
    "NeoMMEForMaskedLM": "text+image",  # the batch's patches in one list; heads wide enough for two M-RoPE axes
    "FunAsrNanoForConditionalGeneration": "text+audio",  # stacked frames first: the mask counts frames, not bins
    "GlmAsrForConditionalGeneration": "text+audio",  # 4 frames merged per token: frames a multiple of 8
    "Qwen3ASRForConditionalGeneration": "text+audio",  # fewer frames than mel bins: the mask counts frames
    "Nemotron3_5TranscribeForConditionalGeneration": "text+audio",  # bins from the speech encoder's config
    "KyutaiSpeechToTextForConditionalGeneration": "text",  # a text stream beside one stream per audio codebook
    "Granite4VisionForConditionalGeneration": "text+image",  # image features injected into text layers, counted
    "VibeVoiceAsrForConditionalGeneration": "text+audio",  # raw mono samples beside the text; latents not sampled
    "LukeForMultipleChoice": "text",  # its entities repeated for every choice, as its words are
    "XmodForMultipleChoice": "text",  # one language id, which its choice head repeats over every sequence
    "ColPaliForRetrieval": "text+image",  # image placeholders and features of the VLM it wraps
    "LwDetrForObjectDetection": "image",  # one feature projector, which only checkpoints list
    "BeitForSemanticSegmentation": "image",  # four layers' features for its segmentation head
    "LiltForQuestionAnswering": "text",  # six layout embeddings that add up to its width
    "HieraForPreTraining": "image",  # noise per mask unit, and units enough that some stay visible
    "PPDocLayoutV3ForObjectDetection": "image",  # its mask branch at the backbone's first-stage width
    "VideoMAEForPreTraining": "video",  # which patches to reconstruct, as many in every sample
    "SplinterForPreTraining": "text",  # where its questions stand
    "ColQwen2ForRetrieval": "text+image",  # images padded to rows of patches; rotary positions from token types
    "ColModernVBertForRetrieval": "text+image",  # a list of images per sample, as the VLM it wraps reads them
    "MusicFlamingoForConditionalGeneration": "text+audio",  # its features read the placeholders: counted beforehand
    # its feature extractor pads to 30 s whatever it is asked; its features map chunks by the raw audio's mask
    "MossTranscribeDiarizeForConditionalGeneration": "text+audio",
    "BltForCausalLM": "text",  # no cache: its config cannot size one
    "EfficientLoFTRForKeypointMatching": "image",  # matches left on a tiny image's coarse grid
    # widths under names of their own: XLM's emb_dim (101 M weights), Gemma 3n's per-layer vocabulary (17 M),
    # HiFi-GAN's first upsampling channels (13 M)
    "FlaubertForMultipleChoice": "text",
    "Gemma3nForCausalLM": "text",
    "SeamlessM4TCodeHifiGan": "text",
    "PPOCRV5MobileDetForObjectDetection": "image",  # an init scale at which the image reaches the text map
    "PPOCRV5ServerDetForObjectDetection": "image",  # intra-class blocks and upsampling factors only checkpoints carry
    "PPOCRV6SmallDetForObjectDetection": "image",  # a backbone with four outputs, each half the one before
    "PPOCRV6MediumDetForObjectDetection": "image",  # both of the above
    "MuseSparkForConditionalGeneration": "text+image+audio",  # raw audio in whole tokens of samples
    # its rope index reads a token its config lacks; its audio features count frames by the mask the forward takes
    "Qwen2_5OmniThinkerForConditionalGeneration": "text+audio+image",
    "PI0ForConditionalGeneration": "text+image",  # a robot state, denoising time and noise; one image per camera
    "JevForDecision": "text",  # questions marked in the prompt
    "FlavaForPreTraining": "text+image",  # no loss (its config asks for one), no per-token image mask
    "Molmo2ForConditionalGeneration": "text+image",  # patches pooled into tokens by indices, as its processor lists
    "Molmo2Adapter": "other",  # the same indices, and the ViT features of the layers it reads; an init scale it survives
    "MoonshineForConditionalGeneration": "text+audio",  # queries shaped by the key/value head count: the encoder's too
    "MoonshineStreamingForConditionalGeneration": "text+audio",  # key/value heads its config does not declare
    "MusicgenForConditionalGeneration": "text",  # its decoder's audio codes, a row per codebook
    "MusicgenMelodyForConditionalGeneration": "text+audio",  # a chromagram: 12 pitch classes per frame
    "Pop2PianoForConditionalGeneration": "text+audio",  # audio features in place of token ids
    "VitsModel": "text",  # noise scaled to nothing: the same speech on every call
    "UnivNetModel": "audio",  # its noise fed beside the spectrogram
    "PeAudioModel": "text+audio",  # mono (batch, 1, samples)
    "VibeVoiceForConditionalGeneration": "text+audio",  # mono (batch, 1, samples)
    "BrosModel": "text",  # box embedding widths derived from the width, even
    "BridgeTowerForContrastiveLearning": "text+image",  # a head per 64 vision channels; undeclared head sizes
    "PPOCRV6SmallRecForTextRecognition": "image",  # a text line tall enough to pool
    "DiaModel": "text",  # its decoder's codes, a column per audio channel
    "OneFormerForUniversalSegmentation": "image",  # a task prompt of its fixed length; mask features of its width
    "CLIPSegForImageSegmentation": "text+image",  # decoder layers the tiny vision tower has
    "XCLIPModel": "text+video",  # clips of num_frames images
    "XCLIPVisionModel": "video",  # the same, frames flattened into the batch
    "AlignModel": "text+image",  # image embeddings as wide as the projection: no width multiplier
    "VisionTextDualEncoderModel": "text+image",  # a ViT pooler as wide as the ViT
    "ClvpModelForConditionalGeneration": "text+audio",  # rotary tables at least 32 wide: one head of 32
    "SeamlessM4TModel": "text+audio",  # speech alone, its attention mask the speech's
    "Gemma4AudioModel": "audio",  # a first convolution as wide as the mel bins
    "Nemotron3DiarizationAudioModel": "audio",  # mel frames it stacks itself
    "AudioFlamingo3Encoder": "audio",  # the frame mask its forward calls optional
    "Qwen3ASREncoder": "audio",  # frames in whole windows, as its model's extractor makes them
    "ConditionalDetrForSegmentation": "image",  # a mask head reading width plus heads channels, in groups of 8
    "FastSpeech2ConformerWithHifiGan": "text",  # token ids in the speech model's vocabulary; a vocoder as wide
    "PPOCRV5ServerRecEncoderWithSVTR": "image",  # the backbone's feature map, not an image
    "VibeVoiceAcousticTokenizerEncoderModel": "audio",  # mono samples, at an init scale they survive
    "VibeVoiceAcousticTokenizerDecoderModel": "audio",  # latent frames, likewise
    "Blip2TextModelWithProjection": "text",  # text through the Q-Former
    "CsmForConditionalGeneration": "text",  # a frame of every codebook per position, the audio in it
    "BlipForQuestionAnswering": "text+image",  # the answer decoder's tokens
    "VisualBertForRegionToPhraseAlignment": "text",  # image regions, and where each phrase is read
    "EncodecModel": "audio",  # codebooks that are not all zero: the audio reaches the decoded output
    "XcodecModel": "audio",  # codes as wide as its two encoders together
    "NeuCodecModel": "audio",  # latents spread over its scalar quantizer's levels: the audio reaches the output
    "MimiDecoderModel": "audio",  # latent frames
    # a required mask that may be None; mel frames as wide as its input_size; depthwise channels under
    # names of their own
    "Phi4MultimodalAudioModel": "other",
    "Qwen2_5OmniToken2WavBigVGANModel": "other",  # mel bins first; channels to halve six times
    "ClapModel": "text+audio",  # one mel view, not four fused copies; a Swin tower's output width
    "DeepseekOcr2TextModel": "text",  # layer kinds its composite config would set
    "Gemma4VisionModel": "image",  # raw patches, each with its grid position
    "SpeechEncoderDecoderModel": "text+audio",  # raw samples for its wav2vec2 encoder, and no features beside
    "SegGptForImageSegmentation": "image",  # an example image and mask, stacked above the image in its canvas
    "T5Gemma2Encoder": "text+image",  # the dropout rate its full config would hand down
    "InklingAudioModel": "audio",  # a code of every codebook per frame
    "SeamlessM4TTextToUnitForConditionalGeneration": "text",  # the text model's states, its decoder's unit tokens
    "MoshiForConditionalGeneration": "text+audio",  # its own and the user's audio codes beside the text
    "DiffusionGemmaEncoderModel": "text+image",  # raw patches and their grid positions under its own name
    "Qwen3OmniMoeTalkerModel": "other",  # the thinker's states: it has no embedding table
    "PatchTSTForPretraining": "time-series",  # forecast masking: the same on every call
    "PatchTSMixerForPretraining": "time-series",
    "JanusVQVAE": "image",  # codes on the encoder's grid of the tiny image
    "Blip2QFormerModel": "image",  # its queries, and the image features they read
    "Blip2ForImageTextRetrieval": "text+image",  # a placeholder per query before the text
    "OmDetTurboForObjectDetection": "image",  # class names and a task prompt; channels-first backbone maps
    "RagTokenForGeneration": "text",  # the passages its retriever would have found, and their scores
    "SLANetSLAHead": "image",  # the backbone's map flattened to a sequence of features
    "SLANetForTableRecognition": "image",  # an init scale at which the image survives its backbone
    "PPOCRV6TinyRecForTextRecognition": "image",  # and its backbone's own
    "EsmForProteinFolding": "text",  # residue types, and a folding trunk shrunk with the rest
    "MuseGlimmerAssistantModel": "other",  # a block to draft after the target model's states, one mask over both
    "SpeechT5Model": "audio",  # no prenets: the encoder and decoder read states of their width
    "ViltForImagesAndTextClassification": "text+image",  # a classifier sized for one image per sample
    "PerceiverModel": "other",  # no preprocessor: states of its width under its generic `inputs`
    "PerceiverForOpticalFlow": "image",  # two frames of 3 x 3 patches, at a tiny train_size
    "UVDocModel": "image",  # every bridge stage fused, on an image that leaves its maps room to reflect-pad
    "VoxtralRealtimeTextModel": "text",  # the delay's time embedding, which its forward reads from **kwargs
    "DiffusionGemmaDecoderModel": "text",  # the encoder's keys and values of the prompt, in a cache
    "PerceiverForMultimodalAutoencoding": "video+audio",  # a dict of modalities, and the outputs to decode
    "Qwen2_5OmniToken2WavDiTModel": "other",  # one flow step: noisy mel frames, their codes, a reference voice
    "GlmImageModel": "text+image",  # a source image then the grid to generate; a codebook token per placeholder
    "UVDocBridge": "image",  # built from its backbone's config, as the backbone builds it
    "TvpForVideoGrounding": "text+video",  # one sample at a time: it views position embeddings at the batch size
}


@pytest.mark.parametrize("name", KINDS)
def test_tiny_model_builds_and_runs_eager_with_its_modality(name):
    context = ClassContext(select(name)[0]).prepare()
    assert context.ok, f"{context.stages[-1].name}: {context.stages[-1].message}"
    assert context.input_set == KINDS[name]
    assert context.inputs["A"] and context.inputs["B"]
    assert sum(p.numel() for p in context.model.parameters()) < 5_000_000, "tiny"


def test_outputs_that_change_between_two_eager_calls_fail_and_those_that_agree_to_rounding_pass():
    """ViLT draws the order of its image patches at random: its patch states move, its pooled answer does not."""
    shuffled = ClassContext(select("ViltModel")[0]).prepare()
    assert not shuffled.ok
    assert shuffled.stages[-1].message.startswith("eager outputs change between two calls")
    assert shuffled.stages[-1].message.endswith(": last_hidden_state"), "the pooled output agrees"
    assert ClassContext(select("ViltForQuestionAnswering")[0]).prepare().ok


def test_a_protein_trunk_is_fed_featurized_proteins_and_found_random():
    """ESMFold 2's trunk takes residues, their atoms and language-model ids, which transformers' featurizer gives per
    protein; it starts from a random pair state, so its eager outputs are no function of its inputs."""
    context = ClassContext(select("EsmFold2Model")[0]).prepare()
    inputs, atoms = context.inputs["A"], context.inputs["A"]["atom_inputs"]
    assert atoms.ref_pos.shape[:2] == atoms.atom_to_token.shape == atoms.atom_attention_mask.shape
    assert inputs["input_ids"].shape == inputs["res_type"].shape == (2, 7)
    assert inputs["input_ids"].max() < context.config.esmc_config.vocab_size, "ESM's own ids, not random text"
    assert context.stages[-1].message.startswith("eager outputs change between two calls")


def test_a_token_to_wav_is_fed_speech_codes_and_found_random():
    """Qwen2.5-Omni's token-to-wav starts its flow from noise drawn in its forward: with a vocoder at an init scale
    that leaves a waveform above the tolerance (at the default one it was 7e-7), the repeat check sees it."""
    context = ClassContext(select("Qwen2_5OmniToken2WavModel")[0]).prepare()
    assert set(context.inputs["A"]) == {"code", "conditioning", "reference_mel"}
    assert context.stages[-1].message.startswith("eager outputs change between two calls")


def test_a_codecs_scalar_quantizer_gives_frames_codes_of_their_own():
    """X-Codec 2 (like NeuCodec) rounds its latents to a few levels per dimension; at the default init scale its
    tiny random encoder shrank them until all rounded to the middle one: one code for every frame of any input."""
    context = ClassContext(select("Xcodec2Model")[0]).prepare()
    assert context.ok, context.stages[-1].message
    codes = context.expected["A"]["audio_codes"]
    assert codes.unique().numel() > codes.numel() // 4


def test_a_deep_convolutional_head_keeps_its_signal_where_an_export_rounds_within_tolerance():
    """ZoeDepth at init scale 0.2 reached activations in the thousands, and an export summing in another order
    missed eager by 8e-4; at its default scale the image fades out before the depth."""
    import exporters

    context = ClassContext(select("ZoeDepthForDepthEstimation")[0]).prepare()
    assert context.ok, context.stages[-1].message
    exporter, config = exporters.exporter_for("dynamo", dynamic=False)
    exported = exporter.export(context.model, context.inputs["A"], config)
    depth = exported(**context.inputs["A"])["predicted_depth"]
    torch.testing.assert_close(depth, context.expected["A"]["predicted_depth"], atol=1e-4, rtol=1e-4)


def test_a_config_whose_defaults_fail_their_own_validation_is_seeded_by_its_overrides():
    config = tiny_config(select("Gemma4AssistantForCausalLM")[0])  # its default text config is a full Gemma 4's
    assert config.text_config.hidden_size_per_layer_input == 0
    assert config.text_config.num_kv_shared_layers == config.text_config.num_hidden_layers <= 4


def test_a_sub_configs_row_applies_where_the_sub_config_is_built():
    """A sub-config validates itself when it is built, before its parent's rows could reach it."""
    dots = tiny_config(select("Dots3NoteForConditionalGeneration")[0])  # checks its adapter width against its own
    assert dots.audio_config.adapter_input_size == dots.audio_config.hidden_size
    llama4 = tiny_config(select("Llama4ForConditionalGeneration")[0])  # only the vision model type has a row
    assert llama4.vision_config.intermediate_size == 4 * llama4.vision_config.hidden_size


def test_a_parents_row_reaches_a_nested_sub_config_without_a_model_type_as_it_is_built():
    """ESMFold 2's atom encoders (no model type, so no row of their own) check their rotary against their head."""
    config = tiny_config(select("EsmFold2Model")[0])
    nested = config.structure_head.diffusion_module.atom_encoder
    assert (config.atom_encoder.num_uid_rope_pairs, nested.num_uid_rope_pairs) == (1, 1)
    assert 3 * nested.num_spatial_rope_pairs_per_axis + nested.num_uid_rope_pairs <= nested.head_dim // 2


def test_local_attention_blocks_are_smaller_than_the_tiny_texts():
    """Pegasus-X's default blocks of 512 pad a tiny text to one block: its block-local attention goes untested, and
    a dynamic ExecuTorch program plans 3.5 GB for it. The tiny texts span blocks; the global tokens fit one."""
    context = ClassContext(select("PegasusXModel")[0]).prepare()
    shortest = min(inputs["input_ids"].shape[1] for inputs in context.inputs.values())
    assert context.config.num_global_tokens <= context.config.block_size < shortest


@pytest.mark.parametrize("name, shorter", [("BartModel", True), ("BartForSequenceClassification", False)])
def test_the_second_input_set_gives_a_decoder_its_own_length(name, shorter):
    """Traced with the decoder as long as its encoder, a program that tied the two lengths passed its dynamic cell
    unseen (an SDPA patch of ours did). A sequence classifier reads its decoder at its encoder's end tokens."""
    inputs = ClassContext(select(name)[0]).prepare().inputs
    assert inputs["A"]["decoder_input_ids"].shape == inputs["A"]["input_ids"].shape
    decoder, encoder = inputs["B"]["decoder_input_ids"].shape[1], inputs["B"]["input_ids"].shape[1]
    assert (decoder < encoder) if shorter else (decoder == encoder)


def test_a_vision_language_model_gets_one_placeholder_per_image_feature():
    context = ClassContext(select("LlavaForConditionalGeneration")[0]).prepare()
    ids = context.inputs["A"]["input_ids"]
    placeholders = (ids == context.config.image_token_id).sum(dim=1)
    assert placeholders.min() > 0 and placeholders.min() == placeholders.max()


def test_special_ids_moved_into_the_tiny_vocabulary_stay_distinct():
    ovis2 = tiny_config(select("Ovis2Model")[0])  # a list of indicator ids beside the image placeholder
    moved = [ovis2.image_token_id, *ovis2.visual_indicator_token_ids]
    assert len(set(moved)) == len(moved) and max(moved) < ovis2.text_config.vocab_size
    glm = tiny_config(select("GlmModel")[0])  # padding apart from the end of text
    assert glm.pad_token_id not in glm.eos_token_id


def test_sizes_shrink_and_agree_across_sub_configs():
    config = tiny_config(select("LlavaForConditionalGeneration")[0])
    assert config.text_config.hidden_size == config.vision_config.hidden_size == WIDTH
    assert config.text_config.vocab_size == VOCAB
    assert config.image_token_id < VOCAB, "placeholder ids move inside the new vocabulary"
    deepseek = tiny_config(select("DeepseekV3ForCausalLM")[0])
    assert deepseek.num_key_value_heads == deepseek.num_attention_heads, "multi-head attention stays multi-head"
    gemma3n = tiny_config(select("LagunaForCausalLM")[0])
    assert len(gemma3n.num_attention_heads_per_layer) == gemma3n.num_hidden_layers, "per-layer lists follow layers"


def test_outputs_within_the_tolerance_of_zero_fail_eager():
    """Perceiver's optical flow at the default init scale (0.02) came out at 3e-4, within ONNX's and ExecuTorch's
    tolerance of zero: a program returning zeros would pass. The tiny config's scale (0.1) keeps it at 0.06."""
    from harness.cells import StageFailure

    context = ClassContext(select("PerceiverForOpticalFlow")[0])
    context._config()
    context.config.initializer_range = 0.02
    context._build()
    with pytest.raises(StageFailure, match=r"every output is within the parity tolerance of zero \(largest \|value\| 3"):
        context._eager()


def test_a_modality_input_the_model_ignores_fails_eager():
    """Outputs that do not depend on the image are not a pass: the image branch must have run."""
    import torch

    from harness.cells import StageFailure

    context = ClassContext(select("CLIPVisionModel")[0])
    context._config()
    context._build()
    embeddings = context.model.embeddings
    fixed = torch.randn(1, 17, embeddings.embed_dim)  # not zeros: those would fail as vanishing outputs first
    embeddings.forward = lambda pixel_values, **kwargs: fixed.expand(pixel_values.shape[0], -1, -1)
    with pytest.raises(StageFailure, match="pixel_values did not change any output: the image branch did not run"):
        context._eager()


def test_text_only_inputs_to_a_vision_language_model_are_not_enough():
    from harness.inputs import unfed_modalities

    context = ClassContext(select("LlavaForConditionalGeneration")[0]).prepare()
    inputs = dict(context.inputs["A"])
    assert unfed_modalities(context.model, inputs) == []
    inputs.pop("pixel_values")
    assert unfed_modalities(context.model, inputs) == ["pixel_values"]


# images by their patch grid, or by their sizes (MiniCPM-V 4.7)
@pytest.mark.parametrize("name", ["Qwen2VLForConditionalGeneration", "MiniCPMV4_7ForConditionalGeneration"])
def test_multimodal_rotary_positions_are_fed_as_the_model_computes_them(name):
    context = ClassContext(select(name)[0]).prepare()
    assert context.ok, context.stages[-1].message
    inputs = context.inputs["A"]
    assert inputs["position_ids"].shape == (3, *inputs["input_ids"].shape)  # temporal, height, width
    assert context.model.model.rope_deltas is None, "computing them leaves no state behind"
    computed_inside = context._forward({name: value for name, value in inputs.items() if name != "position_ids"})
    for name, value in context.expected["A"].items():
        assert torch.equal(computed_inside[name], value), name


@pytest.mark.parametrize("name, precomputed", [
    ("Qwen2_5_VisionTransformerPretrainedModel", {"cu_seqlens", "position_ids", "window_index", "cu_window_seqlens"}),
    ("Kimi_K25VisionModel", {"cu_seqlens", "position_ids", "interp_indices", "frame_index", "temporal_merge_index"}),
    ("MiniCPMV4_7VisionModel", {"position_ids", "window_index", "cu_window_seqlens"}),  # grid from target_sizes
    # its language model reads `cu_seqlens` and `position_ids` too: those go under the prefix its image features strip
    ("Qwen2_5_VLModel", {"window_index", "cu_window_seqlens", "image_cu_seqlens", "image_position_ids"}),
    ("Qwen3ASREncoder", {"cu_seqlens"}),  # its attention windows over the frames the mask leaves
    # image and audio boundaries, each under the prefix its own features strip
    ("Qwen3OmniMoeThinkerModel", {"image_cu_seqlens", "audio_cu_seqlens", "image_position_ids"}),
])
def test_vision_grid_helpers_are_fed_as_the_model_computes_them(name, precomputed):
    context = ClassContext(select(name)[0]).prepare()
    assert context.ok, context.stages[-1].message
    inputs = context.inputs["A"]
    assert precomputed <= set(inputs)
    if name == "Qwen2_5_VLModel":
        assert "cu_seqlens" not in inputs and inputs["position_ids"].shape[0] == 3  # the text's multimodal positions
    computed_inside = context._forward({k: v for k, v in inputs.items() if k not in precomputed})
    for output, value in context.expected["A"].items():
        assert torch.equal(computed_inside[output], value), output


@pytest.mark.parametrize("name", ["DFineForObjectDetection", "PPDocLayoutV4ForObjectDetection"])
def test_detection_queries_are_picked_from_scores_without_ties(name):
    """D-FINE-style detectors keep their top-scoring anchors as queries: tied scores would be ranked in an order
    each runtime breaks its own way (the tiny model's features must not fade to nothing)."""
    context = ClassContext(select(name)[0]).prepare()
    assert context.ok, context.stages[-1].message
    with torch.no_grad():
        scores = context.model(**context.inputs["A"]).enc_outputs_class.max(-1).values
    ranked = scores.sort(dim=-1, descending=True).values
    assert (ranked[:, :-1] - ranked[:, 1:]).min() > 1e-5


def test_depth_bin_logits_stand_clear_of_the_heads_shift():
    """CHMv2 normalises relu'd bin logits after a 1e-8 shift: logits of that size make the depth turn on rounding."""
    context = ClassContext(select("CHMv2ForDepthEstimation")[0]).prepare()
    assert context.ok, context.stages[-1].message
    seen = []
    (to_depth,) = [module for module in context.model.modules() if type(module).__name__ == "CHMv2FeaturesToDepth"]
    hook = to_depth.register_forward_pre_hook(lambda _module, args: seen.append(args[0]))
    with torch.no_grad():
        context.model(**context.inputs["A"])
    hook.remove()
    assert seen[0].abs().median() > 1e-3


@pytest.mark.parametrize("name", ["GroundingDinoForObjectDetection", "MMGroundingDinoForObjectDetection"])
def test_group_norms_of_feature_levels_normalize_more_than_one_value(name):
    """Grounding DINO group-normalizes each feature level in 32 groups. A group of one value (one channel, on the
    1x1 last level) normalizes to rounding noise, which the encoder's layer norm scales up to the signal: ONNX and
    ExecuTorch, rounding their own way, missed eager by 0.04."""
    context = ClassContext(select(name)[0]).prepare()
    assert context.ok, context.stages[-1].message
    group_sizes = []

    def record(module, args, _output):
        group_sizes.append(module.num_channels // module.num_groups * args[0][0, 0].numel())

    norms = [module for module in context.model.modules() if isinstance(module, torch.nn.GroupNorm)]
    hooks = [norm.register_forward_hook(record) for norm in norms]
    with torch.no_grad():
        context.model(**context.inputs["A"])
    for hook in hooks:
        hook.remove()
    assert group_sizes and min(group_sizes) > 1, group_sizes


def test_the_tiny_llama4_bounds_a_dynamic_sequence_by_a_tiny_context():
    """Llama 4's chunked attention bounds the sequence below its chunk; at the real chunk (8,192 tokens) ExecuTorch
    planned attention scores of 34 GB each for the tiny model (bad_alloc at load)."""
    import exporters

    context = ClassContext(select("Llama4ForCausalLM")[0]).prepare()
    assert context.ok, context.stages[-1].message
    exporter, config = exporters.exporter_for("dynamo", dynamic=True)
    exported = exporter.export(context.model, context.inputs["A"], config)
    length = exported.program.graph_signature.user_inputs[0]
    (placeholder,) = [node for node in exported.program.graph.nodes if node.name == length]
    sequence = placeholder.meta["val"].shape[1].node.expr
    assert exported.program.range_constraints[sequence].upper <= 64


@pytest.mark.parametrize("head, whole", [("PPOCRV5MobileRecEncoderWithSVTR", "PPOCRV5MobileRecModel"),
                                         ("PPOCRV5ServerRecEncoderWithSVTR", "PPOCRV5ServerRecModel")])
def test_a_head_on_a_backbones_map_is_fed_a_map_of_about_the_backbones_size(head, whole):
    """Fed at the image's size, the mobile recognizer's SVTR head attended over 6,144 tokens where its backbone
    gives it 6, and ExecuTorch's dynamic plan for it did not fit in memory (bad_alloc at load)."""
    model = ClassContext(select(whole)[0]).prepare().model
    image = make_inputs(model, "A")[0]["pixel_values"]
    with torch.no_grad():
        backbone_map = model.backbone(image).feature_maps[-1]
    context = ClassContext(select(head)[0]).prepare()
    assert context.ok, context.stages[-1].message
    fed = context.inputs["A"]["hidden_states"]
    assert fed.shape[:2] == backbone_map.shape[:2], "the backbone's batch and channels"
    assert fed.shape[-2:].numel() <= 4 * backbone_map.shape[-2:].numel(), (fed.shape, backbone_map.shape)


def test_audio_placeholders_are_expanded_by_the_towers_length_rule():
    """Qwen2-Audio has no get_audio_features to count with; a single placeholder it would expand itself only in
    eager (the expansion is off under export), so the inputs carry one per audio token, as its processor makes."""
    context = ClassContext(select("Qwen2AudioForConditionalGeneration")[0]).prepare()
    assert context.ok, context.stages[-1].message
    inputs, model = context.inputs["A"], context.model
    _, tokens = model.model.audio_tower._get_feat_extract_output_lengths(inputs["feature_attention_mask"].sum(-1))
    assert ((inputs["input_ids"] == model.config.audio_token_id).sum(-1) == tokens).all()


def test_audio_features_are_fed_contiguous():
    """Parakeet's extractor hands back a view of its padded buffer; a trace would take the view's strides for the
    input's and refuse a fresh tensor of another length."""
    context = ClassContext(select("ParakeetEncoder")[0]).prepare()
    assert context.ok, context.stages[-1].message
    for label in ("A", "B"):
        assert context.inputs[label]["input_features"].is_contiguous()


def test_a_class_without_a_forward_of_its_own_is_unavailable_not_failed():
    context = ClassContext(select("Qwen3OmniMoeForConditionalGeneration")[0]).prepare()
    build = context.stages[-1]
    assert (build.name, build.status, build.error_type) == ("build", "unavailable", "NoForward")
    assert "no forward of its own" in build.message


@pytest.mark.parametrize("name", ["MobileNetV2Model", "PPOCRV5MobileDetModel"])
def test_batch_norms_measured_keep_a_tiny_cnn_within_kernel_rounding(name):
    """Measured on one batch of two, MobileNetV2's one-pixel norms and PP-OCRv5 detection's constant channels had
    variances near zero, and dividing by them turned ONNX Runtime's kernel rounding into outputs 2e-2 to 3e-2 off
    PyTorch's."""
    from harness.cells import Cell, run_cell

    context = ClassContext(select(name)[0]).prepare()
    assert context.ok, context.stages[-1].message
    record = run_cell(Cell(context.model_class, "onnx", "static"), context)
    assert record.status == "pass", record.message
    assert record.max_abs_diff < 1e-3
