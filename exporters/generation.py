"""Generation through exported programs: a prefill program and a decode-step program, and a greedy loop that drives
them in their runtime with no eager model in the loop.

- decoder-only models: prefill takes the prompt and returns the logits and the cache; each decode step takes one
  token, the attention mask and the cache, and returns the next logits and the grown cache. With a
  ``DynamicCache`` the cache length is a dynamic axis of the decode program; with a ``StaticCache`` every shape is
  fixed and a ``cache_position`` input says where the token goes.
- encoder-decoder models (T5, BART, Whisper): prefill runs the encoder and the first decoder step; decode steps take
  the encoder's hidden states and an ``EncoderDecoderCache``.

The cache travels between steps as named tensors (``past_key_values.layers.0.keys``, ``cache_params.…`` for
state-space models): one step's outputs are the next step's inputs, whatever runtime runs them. Each step gets the
inputs generate() would give it (positions counted over the attention mask, the last token type again), so the
tokens are generate()'s.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from dataclasses import dataclass, field
from typing import Any

import torch

from .backends import exporter_for
from .dynamo.exporter import auto_dynamic_shapes
from .exported import Exported
from .leaves import named_leaves
from .pytree import register_pytree_nodes

CACHE_KINDS = ("dynamic", "static")
CACHE = "past_key_values"
STATE_SPACE_CACHE = "cache_params"  # Mamba-style models name their cache so
RECURRENT_STATE = "state"  # RWKV's: a list of its layers' states
ENCODER_STATES = "encoder_last_hidden_state"
ENCODER_TUPLE_INPUT = "encoder_outputs.0"
ENCODER_OUTPUT_INPUT = "encoder_outputs.last_hidden_state"


def cache_name(model: torch.nn.Module) -> str:
    """The input (and output) a model's cache travels under."""
    parameters = inspect.signature(model.forward).parameters
    if STATE_SPACE_CACHE in parameters:
        return STATE_SPACE_CACHE
    # PI0 takes a `state` too (its robot's), beside its key-value cache
    return RECURRENT_STATE if RECURRENT_STATE in parameters and CACHE not in parameters else CACHE


def encoder_output(states: torch.Tensor):
    from transformers.modeling_outputs import BaseModelOutput

    return BaseModelOutput(last_hidden_state=states)


@dataclass
class Generated:
    tokens: torch.Tensor  # (batch, new tokens)
    logits: list[torch.Tensor] = field(default_factory=list)  # one (batch, vocab) per new token


def without_decoder_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    """The prompt alone: generation makes the decoder's inputs (``decoder_input_ids`` and its mask) itself."""
    return {name: value for name, value in inputs.items() if not name.startswith("decoder_")}


def generation_prompt(model: torch.nn.Module, inputs: dict[str, Any]) -> dict[str, Any]:
    """The prompt as generate() passes it to a decoder-only model's first step: without the inputs its
    ``prepare_inputs_for_generation`` drops (CTRL makes its own token types)."""
    prompt = without_decoder_inputs(inputs)
    if getattr(model.config, "is_encoder_decoder", False) or "input_ids" not in prompt:
        return prompt
    passed = _first_step_prepared(model, prompt)
    if passed is None:  # a model whose preparation needs more than a prompt: keep the prompt whole
        return prompt
    return {name: value for name, value in prompt.items() if name == "input_ids" or passed.get(name) is not None}


def _first_step_prepared(model: torch.nn.Module, prompt: dict[str, Any]) -> dict[str, Any] | None:
    """What the model's own ``prepare_inputs_for_generation`` makes of the prompt for generate()'s first step, or
    None where it needs more than a prompt."""
    rest = {name: value for name, value in prompt.items() if name != "input_ids"}
    try:
        return model.prepare_inputs_for_generation(prompt["input_ids"], **rest, use_cache=True, is_first_iteration=True)
    except Exception:  # noqa: BLE001 - any model's own code: what it raises is its own
        return None


def with_positions(prompt: dict[str, Any]) -> dict[str, Any]:
    """The prompt with the ``position_ids`` generate() passes a decoder-only model that takes them: counted over the
    attention mask. Models whose own default differs (RoBERTa offsets by its padding index) then agree with it.
    Positions the prompt brings (a multimodal rotary grid, one row per axis) are generate()'s already."""
    if "position_ids" in prompt:
        return prompt
    mask = prompt.get("attention_mask")
    if mask is not None:
        positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
    else:
        positions = torch.arange(prompt["input_ids"].shape[1]).unsqueeze(0).expand(prompt["input_ids"].shape[0], -1)
    return {**prompt, "position_ids": positions}


def next_token_inputs(previous: dict[str, Any]) -> dict[str, Any]:
    """What generate() feeds with the next token besides it: the position after the last one, and the last token
    type again (GPT-J embeds token types)."""
    step = {}
    if "position_ids" in previous:
        last = previous["position_ids"].amax(dim=-1, keepdim=True)
        if last.dim() == 3:  # a rotary grid, one row per axis (Qwen-VL): the next token is text past its furthest
            last = last.amax(dim=0, keepdim=True).expand_as(last)
        step["position_ids"] = last + 1
    if "token_type_ids" in previous:
        step["token_type_ids"] = previous["token_type_ids"][:, -1:]
    return step


def takes_positions(model: torch.nn.Module, prompt: dict[str, Any]) -> bool:
    """generate() passes positions to decoder-only models whose forward names them, unless their own preparation
    of a step drops them (Kosmos-2.5 counts its positions from its padding index itself)."""
    encoder_decoder = bool(getattr(model.config, "is_encoder_decoder", False))
    if encoder_decoder or "position_ids" not in inspect.signature(model.forward).parameters:
        return False
    if "input_ids" not in prompt:
        return True
    passed = _first_step_prepared(model, with_positions(prompt))
    return passed is None or passed.get("position_ids") is not None  # unknown: generate() would pass them


class Generator:
    """A prefill and a decode program of one backend, and how to feed one step's outputs to the next."""

    def __init__(self, prefill: Exported, decode: Exported, encoder_decoder: bool, static_cache: dict | None,
                 decoder_start: int | None, positions: bool = False, cache: str | None = CACHE,
                 encoder_input: str = ENCODER_TUPLE_INPUT, encoder_extras: list[str] | None = None,
                 carried: dict[str, str] | None = None, tokens_to_decoder: bool = False,
                 whole_sequence: bool = False, appended: torch.Tensor | None = None):  # fmt: skip
        self.prefill, self.decode = prefill, decode
        self.encoder_decoder = encoder_decoder
        self.static_cache = static_cache  # zero cache tensors by name, for a StaticCache prefill
        self.decoder_start = decoder_start
        self.positions = positions  # position_ids are an input, as generate() passes them
        self.cache = cache  # the name the cache travels under; None: the model keeps none, each step reads it all
        self.encoder_input = encoder_input  # the name the encoder's states go in under
        self.encoder_extras = encoder_extras or []  # more of the encoder's output: the prefill returns them by name
        self.carried = carried or {}  # prompt inputs every decode step takes again: see `carried_inputs`
        self.tokens_to_decoder = tokens_to_decoder  # the prompt's tokens open the decoder's: see `decoder_prompt`
        self.whole_sequence = whole_sequence  # each decode step takes every token so far: see `reads_whole_sequence`
        self.appended = appended  # tokens a cacheless step reads after the sequence: see `tokens_appended`

    @property
    def applied(self) -> list[str]:
        return list(dict.fromkeys(self.prefill.applied + self.decode.applied))

    def load_runtime(self) -> Generator:
        self.prefill.load_runtime()
        self.decode.load_runtime()
        return self

    def generate(self, inputs: dict[str, Any], max_new_tokens: int) -> Generated:
        """Greedy decoding of ``max_new_tokens`` tokens for the prompt ``inputs``."""
        prompt = without_decoder_inputs(inputs)
        if self.positions:
            prompt = with_positions(prompt)
        batch = next(iter(named_leaves(prompt).values())).shape[0]
        named = dict(named_leaves(prompt))
        per_token = {name: named[name] for name in ("position_ids", "token_type_ids") if name in named}
        if self.encoder_decoder:
            named["decoder_input_ids"] = decoder_prompt(prompt, self.decoder_start, self.tokens_to_decoder)
            if self.tokens_to_decoder:
                del named["input_ids"]
        mask = named.get("attention_mask")
        if self.static_cache is not None:
            named.update({name: tensor.clone() for name, tensor in self.static_cache.items()})
            named["cache_position"] = torch.arange(named["input_ids"].shape[1])
        outputs = self.prefill.run_named(with_tokens_appended(named, self.appended))
        encoder_extras = {name: outputs[name] for name in self.encoder_extras}
        carried = carried_values(self.carried, named, outputs)
        length = named["input_ids"].shape[1] if not self.encoder_decoder else 1
        sequence = named.get("input_ids")
        generated = Generated(torch.empty(batch, 0, dtype=torch.long))
        for step in range(max_new_tokens):
            logits = outputs["logits"][:, -1]
            token = logits.argmax(dim=-1, keepdim=True)
            generated.logits.append(logits)
            generated.tokens = torch.cat([generated.tokens, token], dim=1)
            if step == max_new_tokens - 1:
                break
            if self.cache is None:  # the whole sequence again, one token longer
                named = grown_sequence(named, token)
                outputs = self.decode.run_named(with_tokens_appended(named, self.appended))
                continue
            named = {name: value for name, value in outputs.items() if name.startswith(self.cache + ".")}
            name = "decoder_input_ids" if self.encoder_decoder else "input_ids"
            if self.whole_sequence:
                sequence = torch.cat([sequence, token], dim=1)
            named[name] = sequence if self.whole_sequence else token
            if not self.encoder_decoder:
                per_token = next_token_inputs(per_token)
                named.update(per_token)
                named.update(carried)
            if self.encoder_decoder:
                named[self.encoder_input] = outputs.get(ENCODER_STATES, named.get(self.encoder_input))
                if mask is not None:
                    named["attention_mask"] = mask
                named.update(encoder_extras)
                encoder_states = named[self.encoder_input]
            elif self.static_cache is None and mask is not None and self.cache == CACHE:
                # a static cache masks by cache_position; a state-space step reads no mask (generate() drops it)
                mask = torch.cat([mask, torch.ones(batch, 1, dtype=mask.dtype)], dim=1)
                named["attention_mask"] = mask
            if self.static_cache is not None:
                named["cache_position"] = torch.tensor([length])
            length += 1
            outputs = self.decode.run_named(named)
            if self.encoder_decoder:
                outputs = {**outputs, ENCODER_STATES: encoder_states}
        return generated


def grown_sequence(named: dict[str, torch.Tensor], token: torch.Tensor) -> dict[str, torch.Tensor]:
    """A decoder-only step's inputs one token longer, as generate() feeds a model that keeps no cache."""
    grown = {**named, "input_ids": torch.cat([named["input_ids"], token], dim=1)}
    if "attention_mask" in named:
        mask = named["attention_mask"]
        grown["attention_mask"] = torch.cat([mask, torch.ones_like(mask[:, -1:])], dim=1)
    for name, value in next_token_inputs(named).items():
        grown[name] = torch.cat([named[name], value], dim=-1)
    return grown


def tokens_appended(model: torch.nn.Module, prompt: dict[str, Any]) -> torch.Tensor | None:
    """The tokens a model's own step preparation appends to the sequence it re-reads (XLM appends its mask token and
    reads the next token's logits there), or None. Only for a prompt of ids alone: a mask or positions would have
    to grow with them."""
    if [name for name, value in prompt.items() if isinstance(value, torch.Tensor)] != ["input_ids"]:
        return None
    ids = (_first_step_prepared(model, prompt) or {}).get("input_ids")
    length = prompt["input_ids"].shape[-1]
    if not isinstance(ids, torch.Tensor) or ids.shape[-1] <= length:
        return None
    return ids[:, length:] if torch.equal(ids[:, :length], prompt["input_ids"]) else None


def with_tokens_appended(named: dict[str, Any], appended: torch.Tensor | None) -> dict[str, Any]:
    if appended is None:
        return named
    return {**named, "input_ids": torch.cat([named["input_ids"], appended], dim=1)}


def _sequence_axes(prompt: dict[str, Any]) -> dict[str, Any]:
    """``Dim.AUTO`` on the last axis of every per-token input (the sequence a cacheless step re-reads): the integer
    tensors as long as the prompt (ids, mask, positions, token types). A floating input is a feature map (an image's
    pixels), whose width may equal the prompt's length by chance."""
    length = prompt["input_ids"].shape[-1]

    def per_token(value: Any) -> bool:
        return (
            isinstance(value, torch.Tensor)
            and value.dim() > 0
            and value.shape[-1] == length
            and not value.is_floating_point()
        )

    return {
        name: {value.dim() - 1: torch.export.Dim.AUTO} if per_token(value) else None for name, value in prompt.items()
    }


def decoder_prompt(prompt: dict[str, Any], start: int, tokens_to_decoder: bool) -> torch.Tensor:
    """An encoder-decoder's first decoder tokens: the start token, then, for a model whose encoder reads another
    modality (PP-FormulaNet's image), the prompt's tokens, which generate() hands the decoder."""
    batch = next(iter(named_leaves(prompt).values())).shape[0]
    first = torch.full((batch, 1), start, dtype=torch.long)
    return torch.cat([first, prompt["input_ids"]], dim=1) if tokens_to_decoder else first


def decoder_start_token(config) -> int | None:
    for candidate in (config, getattr(config, "decoder", None), getattr(config, "text_config", None)):
        value = getattr(candidate, "decoder_start_token_id", None) if candidate is not None else None
        if isinstance(value, int):
            return value
    value = getattr(config, "bos_token_id", None)
    return value if isinstance(value, int) else 0


def export_for_generation(
    model: torch.nn.Module,
    inputs: dict[str, Any],
    backend: str,
    cache: str = "dynamic",
    max_cache_len: int = 64,
) -> Generator:
    """Export ``model``'s prefill and decode step for ``backend``; ``inputs`` is a prompt (encoder inputs for an
    encoder-decoder model, ``input_ids`` and ``attention_mask`` for a decoder-only one)."""
    if cache not in CACHE_KINDS:
        raise ValueError(f"unknown cache {cache!r}: expected one of {', '.join(CACHE_KINDS)}")
    register_pytree_nodes(model)
    encoder_decoder = bool(getattr(model.config, "is_encoder_decoder", False))
    if encoder_decoder and cache == "static":
        raise ValueError("a static cache is for decoder-only models here; encoder-decoder models use the dynamic one")
    prompt = without_decoder_inputs(inputs)
    positions = takes_positions(model, prompt)
    if positions:
        prompt = with_positions(prompt)
    batch = next(iter(named_leaves(prompt).values())).shape[0]
    start = decoder_start_token(model.config)
    tokens_to_decoder = encoder_decoder and "input_ids" in prompt and model.main_input_name != "input_ids"

    # ── prefill ──
    prefill_inputs = {**prompt, "use_cache": True}
    if encoder_decoder and getattr(model.config, "use_cache", False):
        # the decoder caches by its config; a forward that hands its kwargs to the encoder too (Switch Transformers)
        # would have the encoder refuse the flag, which generate() never passes it (it runs the encoder apart)
        del prefill_inputs["use_cache"]
    static_cache = None
    if encoder_decoder:
        prefill_inputs["decoder_input_ids"] = decoder_prompt(prompt, start, tokens_to_decoder)
        if tokens_to_decoder:
            del prefill_inputs["input_ids"]
    elif cache == "static":
        from transformers.cache_utils import StaticCache

        empty = StaticCache(config=model.config, max_cache_len=max_cache_len)
        with torch.no_grad():  # a StaticCache allocates its tensors on its first update
            model(
                **prompt,
                past_key_values=empty,
                use_cache=True,
                cache_position=torch.arange(prompt["input_ids"].shape[1]),
            )
        for name, tensor in named_leaves(empty).items():
            tensor.zero_()
        static_cache = {f"{CACHE}.{name}": tensor for name, tensor in named_leaves(empty).items()}
        prefill_inputs.update(past_key_values=empty, cache_position=torch.arange(prompt["input_ids"].shape[1]))
    with torch.no_grad():  # the decode step's example inputs come from one eager prefill
        try:
            first = model(**copy.deepcopy(prefill_inputs))
        except Exception:  # noqa: BLE001 - any model's own code: what it raises is its own
            if model.generation_config.use_cache is not False or prefill_inputs.get("use_cache") is not True:
                raise
            # generate() runs this model without a cache, and its forward cannot make one (BLT sizes its cache from
            # a config that has no layer count): the program re-reads the sequence at every step, as generate() does
            prefill_inputs["use_cache"] = False
            first = model(**copy.deepcopy(prefill_inputs))
    cache_input = cache_name(model)
    if getattr(first, cache_input, None) is None and not encoder_decoder and cache == "dynamic":
        # no cache to return (GPT-1, BERT as a decoder): generate() re-reads the sequence at every step, and so does
        # one program whose sequence axis is dynamic
        appended = tokens_appended(model, prompt)
        traced = with_tokens_appended(prompt, appended)
        exporter, config = exporter_for(backend, dynamic=True, dynamic_shapes=_sequence_axes(traced))
        program = exporter.export(model, copy.deepcopy(traced), config)
        return Generator(program, program, False, None, start, positions, cache=None, appended=appended)
    # ── decode step: its example inputs come first, as they say what the prefill must return ──
    token = first.logits[:, -1:].argmax(dim=-1)
    decode_inputs: dict[str, Any] = {cache_input: getattr(first, cache_input), "use_cache": True}
    extras: list[str] = []  # what of the encoder's output, besides its states, the decode step reads
    carried: dict[str, str] = {}
    whole_sequence = False
    if encoder_decoder:
        decode_inputs["decoder_input_ids"] = token
        if "attention_mask" in prompt:
            decode_inputs["attention_mask"] = prompt["attention_mask"]
        # one more eager step: a self-attention cache of length 1 would be specialised to 1 by the trace
        second = _second_step(model, prompt, first.encoder_last_hidden_state, decode_inputs)
        decode_inputs.update({CACHE: second.past_key_values, "decoder_input_ids": second.logits[:, -1:].argmax(dim=-1)})
        if not isinstance(decode_inputs["encoder_outputs"], tuple):
            extras = [f"encoder_outputs.{name}" for name in named_leaves(decode_inputs["encoder_outputs"])
                      if name != "last_hidden_state"]  # fmt: skip
    else:
        step = _first_decode_step_prepared(model, prompt, first, token)
        whole_sequence = cache == "dynamic" and reads_whole_sequence(prompt, step)  # a static program: one length
        decode_inputs["input_ids"] = torch.cat([prompt["input_ids"], token], dim=1) if whole_sequence else token
        decode_inputs.update(next_token_inputs(prompt))
        if "attention_mask" in prompt and cache != "static" and cache_input == CACHE:
            decode_inputs["attention_mask"] = torch.cat(
                [prompt["attention_mask"], torch.ones(batch, 1, dtype=prompt["attention_mask"].dtype)], dim=1
            )
        carried = carried_inputs(prompt, first, step)
        decode_inputs.update(carried_values(carried, prompt, named_leaves(first)))
    # trace with the layout the loop feeds back: contiguous (a model may return its cache as transposed views)
    decode_inputs[cache_input] = torch.utils._pytree.tree_map_only(
        torch.Tensor, torch.Tensor.contiguous, decode_inputs[cache_input]
    )
    if cache == "static":
        decode_inputs["cache_position"] = torch.tensor([prompt["input_ids"].shape[1]])
        exporter, config = exporter_for(backend)
    else:  # the cache grows by one position per step: its length is a dynamic axis
        shapes = {cache_input: auto_dynamic_shapes(decode_inputs[cache_input])}
        for name, value in decode_inputs.items():
            if name != cache_input and isinstance(value, torch.Tensor):
                grows = (name == "attention_mask" and not encoder_decoder) or (name == "input_ids" and whole_sequence)
                shapes[name] = {1: torch.export.Dim.AUTO} if grows else None
            elif name == "encoder_outputs":  # a ModelOutput flattens to a list
                shapes[name] = (None,) if isinstance(value, tuple) else [None] * len(value)
        exporter, config = exporter_for(backend, dynamic=True, dynamic_shapes=shapes)
    with _seen_tokens_read_from_the_mask(model, sliding=cache == "dynamic" and not encoder_decoder), \
            _sliding_layers_kept_whole(encoder_decoder):
        decode = exporter.export(model, copy.deepcopy(decode_inputs), config)
    prefill_exporter, prefill_config = exporter_for(backend)
    with _encoder_fields_returned(model, extras), _sliding_layers_kept_whole(encoder_decoder):
        prefill = prefill_exporter.export(model, copy.deepcopy(prefill_inputs), prefill_config)
    as_output = encoder_decoder and not isinstance(decode_inputs["encoder_outputs"], tuple)
    encoder_input = ENCODER_OUTPUT_INPUT if as_output else ENCODER_TUPLE_INPUT
    return Generator(prefill, decode, encoder_decoder, static_cache, start, positions, cache_input, encoder_input,
                     extras, carried, tokens_to_decoder, whole_sequence)  # fmt: skip


_STEP_INPUTS = {"input_ids", "attention_mask", "position_ids", "token_type_ids", CACHE, STATE_SPACE_CACHE,
                RECURRENT_STATE, "cache_position", "use_cache", "inputs_embeds"}  # fmt: skip


def _first_decode_step_prepared(model: torch.nn.Module, prompt: dict[str, Any], first: Any,
                               token: torch.Tensor) -> dict[str, Any] | None:  # fmt: skip
    """What generate() hands a decoder-only model's first decode step, as the model's own
    ``_update_model_kwargs_for_generation`` and ``prepare_inputs_for_generation`` make it from the prefill's output
    ``first`` and the new ``token``; None where the preparation needs more than this."""
    kwargs = {name: value for name, value in prompt.items() if name != "input_ids"}
    try:
        kwargs = model._update_model_kwargs_for_generation(
            first, {**kwargs, "use_cache": True}, is_encoder_decoder=False
        )
        return model.prepare_inputs_for_generation(
            torch.cat([prompt["input_ids"], token], dim=1), **kwargs, next_sequence_length=1
        )
    except Exception:  # noqa: BLE001 - any model's own code: what it raises is its own
        return None


def reads_whole_sequence(prompt: dict[str, Any], step: dict[str, Any] | None) -> bool:
    """A decode step that takes every token so far beside its cache, as generate() hands it (CPM-Ant prepends its
    prompt embeddings and slices the cached part off itself), not the new token alone."""
    ids = (step or {}).get("input_ids")
    return isinstance(ids, torch.Tensor) and ids.shape[-1] == prompt["input_ids"].shape[-1] + 1


def carried_inputs(prompt: dict[str, Any], first: Any, step: dict[str, Any] | None) -> dict[str, str]:
    """``name -> "whole" | "last" | "output:<name>"``: the other inputs generate() hands every decode step, as it
    hands them the first one (``step``, see `_first_decode_step_prepared`): a prompt input whole (X-MOD's language
    ids) or at its last position (Mllama's cross-attention mask, a row per token), or an output of the prefill
    (IDEFICS's image states)."""
    if step is None:  # a preparation that needs more than this: nothing carried
        return {}

    def same(a, b):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)

    outputs = {name: value for name, value in named_leaves(first).items() if not name.startswith((CACHE, "logits"))}
    carried = {}
    for name, value in step.items():
        given = prompt.get(name)
        if name in _STEP_INPUTS or not isinstance(value, torch.Tensor):
            continue
        if same(value, given):
            carried[name] = "whole"
        elif isinstance(given, torch.Tensor) and given.dim() > 1 and same(value, given[:, -1:]):
            carried[name] = "last"
        else:
            produced = next((output for output, state in outputs.items() if same(value, state)), None)
            if produced is not None:
                carried[name] = f"output:{produced}"
    return carried


def carried_values(carried: dict[str, str], prompt: dict[str, Any], outputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The values of ``carried_inputs``, from the prompt and the prefill's ``outputs``."""
    values = {}
    for name, how in carried.items():
        if how.startswith("output:"):
            values[name] = outputs[how.removeprefix("output:")]
        else:
            values[name] = prompt[name] if how == "whole" else prompt[name][:, -1:]
    return values


def _second_step(model: torch.nn.Module, prompt: dict[str, Any], states: torch.Tensor, decode_inputs: dict) -> Any:
    """The second decoder step in eager, ``decode_inputs["encoder_outputs"]`` set to the simplest form the decoder
    takes: a tuple (models turn it into their own output class), a ``BaseModelOutput`` (Florence-2 reads
    ``.last_hidden_state`` itself), or the encoder's own output (Moonshine and Canary read the mask their encoder
    downsampled, NLLB-MoE its router logits)."""

    def forms():
        yield (states,)
        yield encoder_output(states)
        yield model.get_encoder()(**prompt)  # runs under the caller's no_grad: a generator's body runs in next()

    error: AttributeError | None = None
    with torch.no_grad():
        for encoded in forms():
            decode_inputs["encoder_outputs"] = encoded
            try:
                return model(**copy.deepcopy(decode_inputs))
            except AttributeError as caught:
                error = caught
    raise error


@contextlib.contextmanager
def _hooks_held(*handles: torch.utils.hooks.RemovableHandle):
    """Module hooks on for the block, removed after it however it ends."""
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _encoder_fields_returned(model: torch.nn.Module, extras: list[str]) -> contextlib.AbstractContextManager:
    """While the prefill is traced, its outputs also hold the encoder's output fields named in ``extras``
    (``encoder_outputs.attention_mask``), which the decode step reads and the model's own output drops."""
    if not extras:
        return contextlib.nullcontext()
    captured: dict = {}

    def keep(_module, _args, output):
        captured.update(named_leaves(output))

    def add(_module, _args, output):
        return {**dict(output), **{name: captured[name.split(".", 1)[1]] for name in extras}}

    return _hooks_held(model.get_encoder().register_forward_hook(keep), model.register_forward_hook(add))


def _seen_tokens_read_from_the_mask(model: torch.nn.Module, sliding: bool) -> contextlib.AbstractContextManager:
    """A sliding-window cache layer counts the tokens it has seen in a Python int (``cumulative_length``), which a
    trace bakes in: the decode program would then size its masks for the traced step only. While the decode step is
    traced, that count is read from the attention mask's length instead (every token seen, and this step's), so it
    stays symbolic; after the step, the layer holds a plain int again, as the cache it returns is rebuilt from."""
    if not sliding:
        return contextlib.nullcontext()
    counted: list = []

    def before(_module, _args, kwargs):
        mask, tokens, cache = kwargs.get("attention_mask"), kwargs.get("input_ids"), kwargs.get(CACHE)
        if mask is None or tokens is None or cache is None:
            return
        for layer in getattr(cache, "layers", []):
            if type(getattr(layer, "cumulative_length", None)) is int:
                counted.append((layer, layer.cumulative_length + tokens.shape[-1]))
                layer.cumulative_length = mask.shape[-1] - tokens.shape[-1]

    def after(_module, _args, _kwargs, _output):
        for layer, count in counted:
            layer.cumulative_length = count
        counted.clear()

    return _hooks_held(model.register_forward_pre_hook(before, with_kwargs=True),
                       model.register_forward_hook(after, with_kwargs=True))  # fmt: skip


@contextlib.contextmanager
def _sliding_layers_kept_whole(enabled: bool):
    """A decoder's sliding-window cache layer keeps its last ``window - 1`` tokens and counts the tokens it has seen
    in a Python int. An encoder-decoder's decoder starts from one token, so its sliding layers grow for the first
    steps and then stay full: two regimes one decode program cannot trace, and the count (the decoder's positions
    are read from it) is baked in. While its programs are traced, a sliding layer keeps every token as a full
    layer does, and its window is applied by the sliding mask alone, from positions: the same attention."""
    if not enabled:
        yield
        return
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    names = ("update", "get_mask_sizes", "get_seq_length")
    saved = {name: DynamicSlidingWindowLayer.__dict__[name] for name in names}
    try:
        for name in names:
            setattr(DynamicSlidingWindowLayer, name, getattr(DynamicLayer, name))
        yield
    finally:
        for name, method in saved.items():
            setattr(DynamicSlidingWindowLayer, name, method)


def eager_generate(model: torch.nn.Module, inputs: dict[str, Any], max_new_tokens: int) -> Generated:
    """The reference: ``model.generate(do_sample=False)``, never stopping early, with each step's logits."""
    # a copy: generate() may write into its inputs (BLIP sets each prompt's first token in place), and the caller's
    # are the class's inputs, which every later cell is compared on
    prompt = copy.deepcopy(_kwargs_generate_takes(model, without_decoder_inputs(inputs)))
    config = copy.deepcopy(model.generation_config)
    config.update(do_sample=False, num_beams=1, eos_token_id=None, max_new_tokens=max_new_tokens,
                  min_new_tokens=max_new_tokens, output_logits=True, return_dict_in_generate=True,
                  forced_eos_token_id=None, forced_bos_token_id=None, begin_suppress_tokens=None,
                  suppress_tokens=None, no_repeat_ngram_size=0, repetition_penalty=1.0, bad_words_ids=None)  # fmt: skip
    if getattr(model.config, "is_encoder_decoder", False):
        config.decoder_start_token_id = decoder_start_token(model.config)
    if config.pad_token_id is None:
        config.pad_token_id = 0
    # generate() fills a passed config's None fields from the model's own (PLBart's forced_eos_token_id=2 would
    # come back): the model carries the greedy config itself for the call
    saved, model.generation_config = model.generation_config, config
    try:
        with torch.no_grad():
            result = model.generate(**prompt, generation_config=config)
    finally:
        model.generation_config = saved
    sequences = result.sequences
    new = sequences[:, -max_new_tokens:]
    return Generated(new, [logits.float() for logits in result.logits])


def _kwargs_generate_takes(model: torch.nn.Module, prompt: dict[str, Any]) -> dict[str, Any]:
    """The prompt without what generate()'s check of its kwargs refuses: the precomputed tower kwargs a multimodal
    forward takes only through ``**kwargs`` (``image_cu_seqlens``, ``interp_indices``), which eager computes itself
    from the same image grid, to the same values."""
    named = set(inspect.signature(model.forward).parameters)

    def taken(name: str) -> bool:
        try:
            model._validate_model_kwargs({name: prompt[name]})
        except ValueError:
            return False
        return True

    return {name: value for name, value in prompt.items() if name in named or taken(name)}


@dataclass
class GenerationComparison:
    ok: bool
    message: str
    tokens_equal: bool
    first_mismatch: int | None  # the first step whose token differs
    near_tie: int | None  # the first step where eager's two best logits were closer than the tolerance
    max_abs_diff: float  # over the logits of the steps both agree on

    def as_dict(self) -> dict:
        return {"tokens_equal": self.tokens_equal, "first_mismatch": self.first_mismatch, "near_tie": self.near_tie,
                "max_abs_diff": self.max_abs_diff}  # fmt: skip


def compare_generation(eager: Generated, exported: Generated, atol: float, rtol: float) -> GenerationComparison:
    """Tokens must be equal and the logits of every agreeing step close. A token that differs right where eager's
    top two logits were within tolerance of each other is a near-tie (random tiny models have them), not a failure."""
    steps = min(len(eager.logits), len(exported.logits))
    mismatch = next((s for s in range(steps) if not torch.equal(eager.tokens[:, s], exported.tokens[:, s])), None)
    near_tie = None
    for step in range(steps):
        top = eager.logits[step].topk(2, dim=-1).values
        gap = (top[:, 0] - top[:, 1]).abs()
        if bool((gap <= atol + rtol * top[:, 0].abs()).any()):
            near_tie = step
            break
    agreed = steps if mismatch is None else mismatch + 1  # the mismatching step's logits are still comparable
    differences = [float((eager.logits[s] - exported.logits[s]).abs().max()) for s in range(agreed)]
    max_abs = max(differences, default=0.0)
    close = all(torch.allclose(exported.logits[s], eager.logits[s], atol=atol, rtol=rtol) for s in range(agreed))
    if mismatch is None and close:
        return GenerationComparison(True, f"{steps} tokens equal to eager", True, None, near_tie, max_abs)
    if mismatch is not None and near_tie is not None and near_tie <= mismatch:
        return GenerationComparison(
            True, f"tokens equal up to step {mismatch}, where eager's top-2 logits nearly tie (step {near_tie})",
            False, mismatch, near_tie, max_abs,
        )  # fmt: skip
    if mismatch is not None:
        message = f"token {mismatch} differs from eager ({exported.tokens[:, mismatch].tolist()} vs {eager.tokens[:, mismatch].tolist()})"
    else:
        message = f"tokens equal but logits differ beyond atol={atol:g} rtol={rtol:g} (max abs {max_abs:.3g})"
    return GenerationComparison(False, message, mismatch is None, mismatch, near_tie, max_abs)
