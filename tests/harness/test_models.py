"""Enumeration of every model class, and the filters that pick some."""

import subprocess
import sys

import pytest

from harness.models import SelectionError, all_model_classes, select, shard


def _mapped_classes():
    from transformers.models.auto import modeling_auto

    names = set()
    for attribute in dir(modeling_auto):
        if attribute.startswith("MODEL") and attribute.endswith("MAPPING_NAMES"):
            for value in getattr(modeling_auto, attribute).values():
                names.update(value if isinstance(value, (list, tuple)) else [value])
    return names


def test_list_count_matches_the_auto_mappings():
    result = subprocess.run(
        [sys.executable, "-m", "commands", "run", "--models", "all", "--list"],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    last = result.stdout.strip().splitlines()[-1]
    mapped = _mapped_classes()
    everything = all_model_classes()
    extra = len(everything) - len(mapped)
    assert last == (
        f"{len(everything)} classes selected, of {len(everything)} in transformers "
        f"({len(mapped)} from the auto mappings, {extra} more public PreTrainedModel subclasses)"
    )
    assert len(mapped) > 1500 and set(everything) >= mapped
    assert len(result.stdout.strip().splitlines()) == len(everything) + 1


def test_every_class_has_a_model_type_a_config_class_and_tasks():
    from transformers import PreTrainedConfig

    for model in all_model_classes().values():
        assert model.model_type, model
        assert issubclass(model.config_class(), PreTrainedConfig), model
        assert model.tasks and model.task in model.tasks
    llama = all_model_classes()["LlamaForCausalLM"]
    assert (llama.model_type, llama.task) == ("llama", "causal-lm")
    assert all_model_classes()["Gemma3ForConditionalGeneration"].model_type == "gemma3"


def test_a_mapped_class_transformers_does_not_export_loads_from_its_modeling_module():
    import transformers

    assert all(model.module for model in all_model_classes().values())
    voxtral_text = all_model_classes()["VoxtralRealtimeTextModel"]
    assert not hasattr(transformers, voxtral_text.name)
    assert voxtral_text.module == "models.voxtral_realtime.modeling_voxtral_realtime"
    assert voxtral_text.load().__name__ == voxtral_text.name


def test_filters_by_pattern_type_task_and_limit():
    names = [m.name for m in select("Llama*")]
    assert "LlamaForCausalLM" in names and all(n.startswith("Llama") for n in names)
    assert {m.model_type for m in select("all", model_types=["bert"])} == {"bert"}
    assert all("causal-lm" in m.tasks for m in select("all", tasks=["causal-lm"]))
    assert len(select("all", limit=7)) == 7
    assert [m.name for m in select("BertModel,GPT2Model")] == ["BertModel", "GPT2Model"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"models": "LlamaForCausalLMM"}, "no class named 'LlamaForCausalLMM'.*did you mean LlamaForCausalLM"),
        ({"models": "Zzzq*"}, "no class matches 'Zzzq\\*'"),
        ({"models": "all", "model_types": ["lama"]}, "unknown model type 'lama'.*llama"),
        ({"models": "all", "tasks": ["causal_lm"]}, "unknown task 'causal_lm'.*causal-lm"),
        ({"models": "BertModel", "tasks": ["causal-lm"]}, "match no class"),
    ],
)
def test_filters_that_match_nothing_say_so_with_near_matches(kwargs, message):
    with pytest.raises(SelectionError, match=message):
        select(**kwargs)


def test_cli_reports_an_unknown_class_clearly():
    result = subprocess.run(
        [sys.executable, "-m", "commands", "run", "--models", "BertModdel", "--list"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 2
    assert "no class named 'BertModdel'" in result.stderr and "BertModel" in result.stderr


def test_shards_balance_measured_time_not_counts():
    models = select("BertModel,GPT2Model,LlamaForCausalLM,T5Model,ViTModel,CLIPModel")
    weights = {"BertModel": 100.0, "GPT2Model": 10.0, "LlamaForCausalLM": 10.0, "T5Model": 10.0, "ViTModel": 10.0,
               "CLIPModel": 10.0}  # fmt: skip
    first, second = shard(models, 1, 2, weights), shard(models, 2, 2, weights)
    assert {m.name for m in first} | {m.name for m in second} == {m.name for m in models}
    assert not {m.name for m in first} & {m.name for m in second}
    assert [m.name for m in first] == ["BertModel"], "the slow class gets a shard to itself"
    assert len(shard(models, 1, 3)) == 2, "without timings, by count"
    with pytest.raises(ValueError, match="between 1 and 2"):
        shard(models, 3, 2)
