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

# model type -> {config attribute (dotted into sub-configs): value}, applied after the generic shrink.
TINY_OVERRIDES: dict[str, dict] = {}

# model type -> feature extractor class, where the auto mapping names one that does not make this model's inputs.
FEATURE_EXTRACTOR_OVERRIDES: dict[str, str] = {
    "wav2vec2-bert": "SeamlessM4TFeatureExtractor",  # mapped to Wav2Vec2's raw-audio extractor; takes stacked mels
}

# model class -> {"atol": ..., "rtol": ..., "backends": [...], "reason": ...}: a tolerance wider than the default,
# shown on the dashboard next to every cell it applies to.
TOLERANCE_OVERRIDES: dict[str, dict] = {}
