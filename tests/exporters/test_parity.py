"""Each required model through each exporter, static and dynamic, run in its real runtime and compared to eager."""

import pytest

import exporters

from .conftest import TOLERANCE, assert_parity

MODELS = [
    "LlamaForCausalLM",
    "BertModel",
    "ViTForImageClassification",
    "WhisperForConditionalGeneration",
    "T5ForConditionalGeneration",
]


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("backend", exporters.BACKENDS)
@pytest.mark.parametrize("model_name", MODELS)
def test_export_matches_eager(tiny, model_name, backend, dynamic, tmp_path):
    """Run at the size it was exported at; a dynamic one also saved, loaded and run at another size."""
    model = tiny(model_name)
    exporter, config = exporters.exporter_for(backend, dynamic=dynamic)
    exported = exporter.export(model.model, model.inputs["A"], config)
    assert_parity(exported(**model.inputs["A"]), model.expected["A"], TOLERANCE[backend])
    if dynamic:
        loaded = exporters.load(exported.save(tmp_path))
        assert type(loaded) is type(exported)
        assert loaded.metadata["stages"] == exported.metadata["stages"]
        assert_parity(loaded(**model.inputs["B"]), model.expected["B"], TOLERANCE[backend])


def test_load_rejects_a_folder_that_is_not_an_export(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a saved export"):
        exporters.load(tmp_path)
    (tmp_path / "export.json").write_text("{not json")
    with pytest.raises(ValueError, match="unreadable export metadata"):
        exporters.load(tmp_path)


def test_constant_inputs_are_baked_and_checked(tiny):
    model = tiny("LlamaForCausalLM")
    inputs = {**model.inputs["A"], "use_cache": False}
    exported = exporters.DynamoExporter().export(model.model, inputs)
    assert exported.metadata["constants"] == {"use_cache": False}
    assert "use_cache" not in exported.input_names
    assert list(exported(**inputs)) == ["logits"]
    with pytest.raises(ValueError, match="use_cache=True differs"):
        exported(**{**inputs, "use_cache": True})


def test_dynamic_sliding_window_cache_returns_every_traced_output(tiny):
    model = tiny("Gemma2ForCausalLM")
    exporter, config = exporters.exporter_for("dynamo", dynamic=True)
    exported = exporter.export(model.model, model.inputs["A"], config)
    outputs = exported(**model.inputs["B"])
    assert list(outputs) == exported.output_names
    # the window's count of tokens seen is the full-attention layer's length: the cache holds it, no output carries it
    assert not [name for name in outputs if name.endswith("cumulative_length")]
    tensors = {name: value for name, value in outputs.items() if name in model.expected["B"]}
    assert_parity(tensors, model.expected["B"], TOLERANCE["dynamo"])
