import torch

from harness.cells import compare


def test_per_image_parts_an_export_kept_whole_are_compared_joined():
    parts = [torch.randn(4, 3), torch.randn(2, 3), torch.randn(5, 3)]
    expected = {"logits": torch.ones(2), **{f"image_hidden_states.{i}": part for i, part in enumerate(parts)}}
    whole = {"logits": torch.ones(2), "image_hidden_states.0": torch.cat(parts)}
    ok, details, _, _ = compare(whole, expected, 1e-4, 1e-4)
    assert ok and details["image_hidden_states.0"]["joined"] == 3 and list(details) == ["logits", "image_hidden_states.0"]

    shuffled = {**whole, "image_hidden_states.0": torch.cat(parts[::-1])}
    assert not compare(shuffled, expected, 1e-4, 1e-4)[0]


def test_a_list_an_export_cut_short_still_fails():
    layers = [torch.randn(2, 5, 3) for _ in range(3)]  # hidden states: one per layer, not per image
    expected = {f"hidden_states.{i}": layer for i, layer in enumerate(layers)}
    ok, details, _, _ = compare({"hidden_states.0": layers[0]}, expected, 1e-4, 1e-4)
    assert not ok and "joined" in details["hidden_states.0"] and "shape" in details["hidden_states.0"]["problem"]


def test_non_finite_outputs_count_as_matched_where_both_agree_and_are_counted():
    inf, nan = float("inf"), float("nan")
    expected = {"scores": torch.tensor([[1.0, -inf, nan, 2.0]])}
    ok, details, max_abs, _ = compare({"scores": torch.tensor([[1.0, -inf, nan, 2.0]])}, expected, 1e-4, 1e-4)
    assert ok and max_abs == 0.0  # -inf against -inf is no difference
    assert (details["scores"]["elements"], details["scores"]["nonfinite"]) == (4, 2)
    moved = {"scores": torch.tensor([[1.0, nan, -inf, 2.0]])}
    assert not compare(moved, expected, 1e-4, 1e-4)[0]
