"""The Dynamo model patches of `exporters/dynamo/patches/vision_tokens.py` (image tokens laid into the text): each
passes with its workaround and fails, or differs from eager, without it.
"""

import pytest
import torch

from exporters.registration import apply_patches

from .modules import built_by_the_sweep, check_class_case


CLASS_CASES = [  # (model class, tiny as the sweep builds it, backend, workaround, error without it)
    ("Llama4VisionModel", "executorch", "_patch_llama4_vision_rotary_as_pairs", "complex"),
    ("Ovis2Model", "dynamo", "_patch_ovis2_visual_indicators_by_where", "data-dependent"),
    # patches gathered in a random order, the padding drawn at random, positions resized to each image's extent
    ("ViltForQuestionAnswering", "dynamo", "_patch_vilt_patches_in_place", "data-dependent"),
    # its sparse-attention indexer lists each query's keys with nonzero
    ("Qwen4ExpTextModel", "dynamo", "_patch_qwen4_indexer_by_masks", "data-dependent"),
]


@pytest.mark.parametrize("name, backend, workaround, error", CLASS_CASES, ids=[case[2] for case in CLASS_CASES])
def test_a_model_class_exports_with_its_workaround_and_fails_without(name, backend, workaround, error):
    check_class_case(name, backend, workaround, error)


def test_vilt_patches_kept_in_place_answer_like_eager_for_images_of_other_extents():
    context = built_by_the_sweep("ViltForQuestionAnswering")
    torch.nn.init.normal_(context.model.vilt.embeddings.position_embeddings)  # positions that move the pooled state
    inputs = dict(context.inputs["A"])
    batch, _channels, height, width = inputs["pixel_values"].shape
    whole = torch.ones(batch, height, width, dtype=torch.long)
    inputs["pixel_mask"] = whole.clone()
    inputs["pixel_mask"][1, height // 2:] = 0  # the second image: 2 x 3 of the 4 x 4 patches, its table resized to it
    inputs["pixel_mask"][1, :, width * 3 // 4:] = 0
    fired = set()
    with torch.no_grad():
        eager = context.model.vilt(**inputs).pooler_output  # its patch states come in a random order
        assert not torch.allclose(eager, context.model.vilt(**dict(inputs, pixel_mask=whole)).pooler_output, atol=1e-4)
        with apply_patches("dynamo", fired):
            in_place = context.model.vilt(**inputs).pooler_output
    assert "_patch_vilt_patches_in_place" in fired
    torch.testing.assert_close(in_place, eager, atol=1e-6, rtol=1e-5)


def test_qwen4_indexer_by_masks_keeps_the_blocks_the_loop_keeps():
    """40 keys make 10 blocks of which a query keeps 2: the ranking decides. Eight indexer heads and no padding
    token ids, so that no query's scores tie."""
    import copy

    tiny = built_by_the_sweep("Qwen4ExpTextModel").model
    config = copy.deepcopy(tiny.config)
    config.indexer_n_heads = 8
    torch.manual_seed(0)
    model = type(tiny)(config).eval()
    input_ids = torch.randint(1, config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :5] = 0
    fired = set()
    with torch.no_grad():
        loop = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        with apply_patches("dynamo", fired):
            masks = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    assert "_patch_qwen4_indexer_by_masks" in fired
    torch.testing.assert_close(masks, loop, atol=1e-5, rtol=1e-5)
