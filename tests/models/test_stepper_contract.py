"""models/stepping.py's contract, rule by rule (mutmut's survivors on the stepping helper):
every refusal word for word at its boundary, the context a batch needs, the
keywords a model's forward receives (only those it takes), what a ``gencraft_step`` receives,
the hidden states of every path, explicit rows, and the ids a logits processor sees."""

from __future__ import annotations

import inspect

import pytest
import torch
from method_testing import small_fame, small_llama
from torch import nn
from transformers import LogitsProcessor

from gencraft.errors import GencraftError
from gencraft.models.architectures import tiny_architecture
from gencraft.models.caches import left_pad
from gencraft.models.introspect import context_size
from gencraft.models.stepping import (
    HFStepper,
    ProcessorChain,
    StepOutput,
    _accepts,
    _check_mask,
    resolve,
)

V = 12


def _peaked(kind: str, seed: int = 0) -> nn.Module:
    """A tiny random model whose next-token distributions are peaked (rows that get another
    row's states or positions show)."""
    model = tiny_architecture(kind, vocab_size=V, seed=seed)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    return model.eval()


def _refusal(fn) -> str:
    with pytest.raises(GencraftError) as err:
        fn()
    return str(err.value)


LLAMA = small_llama(0, vocab=V, context=8)
IDS = torch.tensor([[3, 4, 5], [0, 6, 7]])
MASK = torch.tensor([[1, 1, 1], [0, 1, 1]])


class _Handwritten:
    """A Stepper of one input over a fixed table (no ``batch_size``, no ``prefix_ids``)."""

    vocab_size = V


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: HFStepper(nn.Linear(2, 2), IDS, max_new_tokens=1),
            "search needs a Hugging Face causal LM or encoder-decoder (or a gencraft wrapper of "
            "one), got Linear",
        ),
        (
            lambda: HFStepper(LLAMA, IDS.float(), max_new_tokens=1),
            "input_ids must be a LongTensor of shape [B, P]",
        ),
        (
            lambda: HFStepper(LLAMA, IDS.tolist(), max_new_tokens=1),
            "input_ids must be a LongTensor of shape [B, P]",
        ),
        (
            lambda: HFStepper(LLAMA, IDS[0], max_new_tokens=1),
            "input_ids must have shape [B, P] with B, P >= 1, got [3]",
        ),
        (
            lambda: HFStepper(LLAMA, IDS[:0], max_new_tokens=1),
            "input_ids must have shape [B, P] with B, P >= 1, got [0, 3]",
        ),
        (
            lambda: HFStepper(LLAMA, IDS[:, :0], max_new_tokens=1),
            "input_ids must have shape [B, P] with B, P >= 1, got [2, 0]",
        ),
        (
            lambda: HFStepper(LLAMA, IDS, max_new_tokens=0),
            "max_new_tokens must be >= 1, got 0",
        ),
        (
            lambda: HFStepper(LLAMA, torch.tensor([[1, V]]), max_new_tokens=1),
            f"input_ids hold ids outside the vocabulary [0, {V})",
        ),
        (
            lambda: HFStepper(LLAMA, torch.tensor([[-1, 1]]), max_new_tokens=1),
            f"input_ids hold ids outside the vocabulary [0, {V})",
        ),
        (
            lambda: HFStepper(LLAMA, IDS, attention_mask=MASK[:, :2], max_new_tokens=1),
            "attention_mask must have shape [2, 3], got [2, 2]",
        ),
        (
            lambda: HFStepper(LLAMA, IDS, attention_mask=MASK * 2, max_new_tokens=1),
            "attention_mask must hold only 0 (padding) and 1 (tokens)",
        ),
        (
            # padding after a token in the middle of the row (not only against column 0)
            lambda: HFStepper(
                LLAMA, IDS, attention_mask=torch.tensor([[1, 1, 1], [0, 1, 0]]), max_new_tokens=1
            ),
            "a causal LM's prompts must be left-padded (padding before the tokens); set "
            "tokenizer.padding_side = 'left'",
        ),
        (
            lambda: HFStepper(LLAMA, IDS, max_new_tokens=1).step(
                torch.zeros(5, dtype=torch.long), None
            ),
            "5 hypotheses are not 2 equal blocks; pass rows=[N]",
        ),
        (
            lambda: resolve(LLAMA, None, None, max_new_tokens=1),
            "input_ids is required with a model",
        ),
        (
            lambda: resolve(_Handwritten(), None, None, max_new_tokens=1),
            "eos_token_id is required with a Stepper",
        ),
        (
            lambda: resolve(_Handwritten(), None, [1, V], max_new_tokens=1),
            f"eos_token_id [1, {V}] outside the vocabulary [0, {V})",
        ),
        (
            lambda: resolve(LLAMA, IDS, -1, max_new_tokens=1),
            f"eos_token_id [-1] outside the vocabulary [0, {V})",
        ),
    ],
)
def test_every_refusal_word_for_word(make, message):
    assert _refusal(make) == message


def test_the_last_id_and_eos_of_the_vocabulary_are_accepted():
    stepper, eos = resolve(LLAMA, torch.tensor([[0, V - 1]]), V - 1, max_new_tokens=1)
    assert eos == [V - 1] and stepper.start().log_probs.shape == (1, V)


def test_a_padded_batch_needs_its_longest_prompt_plus_the_new_tokens():
    """The check counts the longest row's tokens (a column of padding in every row is free),
    and an encoder-decoder counts one start token, whatever its source's length."""
    ctx = context_size(LLAMA)
    mask = torch.tensor([[0, 1, 1], [0, 0, 1]])  # the longest row has 2 tokens
    HFStepper(LLAMA, IDS, attention_mask=mask, max_new_tokens=ctx - 2)
    assert _refusal(lambda: HFStepper(LLAMA, IDS, attention_mask=mask, max_new_tokens=ctx - 1)) == (
        f"a prompt of 2 tokens plus max_new_tokens={ctx - 1} exceeds the model's context of "
        f"{ctx} positions"
    )
    bart = _peaked("bart")
    ctx = context_size(bart)
    source = torch.arange(3, 3 + 6)[None].repeat(2, 1)
    HFStepper(bart, source, max_new_tokens=ctx - 1)
    assert _refusal(lambda: HFStepper(bart, source, max_new_tokens=ctx)) == (
        f"1 start token plus max_new_tokens={ctx} exceeds the model's context of {ctx} positions"
    )


def test_hidden_states_only_when_asked():
    assert HFStepper(LLAMA, IDS, max_new_tokens=1).start().hidden is None
    stepper, _ = resolve(LLAMA, IDS, None, max_new_tokens=1)
    assert stepper.hidden is False and stepper.start().hidden is None


def test_a_mask_that_pads_nothing_is_dropped():
    assert _check_mask(torch.ones(2, 3), 2, 3, left=True) is None
    padded = _check_mask(MASK.bool(), 2, 3, left=True)
    assert padded.dtype == torch.long and torch.equal(padded, MASK)


def test_accepts_reads_the_signature():
    assert _accepts(lambda a: 0, "a") and not _accepts(lambda a: 0, "b")
    assert _accepts(lambda a, **kw: 0, "b")
    assert not _accepts(object(), "a")  # no signature: take nothing for granted


def test_left_pad_pads_the_sequence_axis_whatever_the_head_count():
    x = torch.randn(1, 3, 1, 4)  # 3 heads, 1 position
    out = left_pad(x, 3)
    assert out.shape == (1, 3, 3, 4)
    assert torch.equal(out[:, :, 2:], x) and not out[:, :, :2].any()


# ---------------------------------------------------------------- what a forward receives
def _restrict(model: nn.Module, *, positions: bool, seen: list) -> nn.Module:
    """``model`` whose forward takes the listed keywords only (no ``**kwargs``), as a
    hand-written or older model's forward does; records what each call received."""
    base_forward = type(model).forward

    def forward(
        input_ids=None,
        attention_mask=None,
        past_key_values=None,
        use_cache=None,
        return_dict=None,
        output_hidden_states=None,
        **pos,
    ):
        seen.append(sorted(k for k, v in pos.items() if v is not None))
        return base_forward(
            model,
            input_ids=input_ids,
            attention_mask=attention_mask,
            past_key_values=past_key_values,
            use_cache=use_cache,
            return_dict=return_dict,
            output_hidden_states=output_hidden_states,
            **pos,
        )

    params = [p for p in inspect.signature(forward).parameters.values() if p.name != "pos"]
    if positions:
        params.append(
            inspect.Parameter("position_ids", inspect.Parameter.KEYWORD_ONLY, default=None)
        )
    forward.__signature__ = inspect.Signature(params)
    model.forward = forward
    return model


def _solo(model, ids, mask, row, tokens):
    """Row ``row``'s start and one step of ``tokens`` [1], stepped alone without padding."""
    keep = ids[row][mask[row].bool()][None]
    stepper = HFStepper(model, keep, max_new_tokens=3)
    first = stepper.start()
    return first, stepper.step(tokens, first.cache)


def test_a_forward_that_takes_position_ids_gets_them_for_a_padded_batch():
    """GPT-2's positions are absolute, so a left-padded row is right only with its own
    positions; a forward without ``**kwargs`` still gets them when it names them."""
    seen: list = []
    model = _restrict(_peaked("gpt2"), positions=True, seen=seen)
    stepper = HFStepper(model, IDS, attention_mask=MASK, max_new_tokens=3)
    first = stepper.start()
    nxt = stepper.step(torch.tensor([4, 5]), first.cache)
    assert seen and all(s == ["position_ids"] for s in seen)
    for row, tok in ((0, 4), (1, 5)):
        a, b = _solo(_peaked("gpt2"), IDS, MASK, row, torch.tensor([tok]))
        torch.testing.assert_close(first.log_probs[row], a.log_probs[0])
        torch.testing.assert_close(nxt.log_probs[row], b.log_probs[0])


def test_a_forward_without_position_ids_never_gets_them():
    """Not at the start, a step or a ragged step of hypotheses of different lengths."""
    seen: list = []
    model = _restrict(small_llama(1, vocab=V), positions=False, seen=seen)
    stepper = HFStepper(model, IDS, attention_mask=MASK, max_new_tokens=3)
    first = stepper.start()
    stepper.step(torch.tensor([4, 5]), first.cache)
    caches = stepper.split(first.cache)  # prompts of 3 and 2 tokens: ragged
    outs = stepper.step_ragged(torch.tensor([4, 5]), caches, torch.tensor([0, 1]))
    assert len(outs) == 2 and seen == [[], [], []]


@pytest.mark.parametrize("kind", ["llama", "bart"])
def test_a_model_whose_config_turns_off_the_cache_still_steps(kind):
    """The stepper asks for the cache itself. (``config.return_dict = False`` is not tested:
    neither model runs with it under transformers 5, so ``return_dict=True`` changes nothing.)"""
    model = _peaked(kind)
    want = HFStepper(model, IDS[:, 1:], max_new_tokens=2)
    want_next = want.step(torch.tensor([4, 5]), want.start().cache)
    model.config.use_cache = False
    got = HFStepper(model, IDS[:, 1:], max_new_tokens=2)
    got_next = got.step(torch.tensor([4, 5]), got.start().cache)
    torch.testing.assert_close(got_next.log_probs, want_next.log_probs)


# ---------------------------------------------------------------- rows and encoder states
@pytest.mark.parametrize("kind", ["gpt2", "bart"])
def test_explicit_rows_name_each_hypothesis_input(kind):
    """Hypotheses reordered against the blocks (input 1's first): with ``rows`` each gets its
    own input's mask (causal) or encoder states (encoder-decoder), as when stepped alone."""
    model = _peaked(kind)
    ids = IDS if kind == "gpt2" else torch.tensor([[3, 4, 5], [6, 7, 8]])
    mask = MASK if kind == "gpt2" else torch.ones_like(ids)
    stepper = HFStepper(model, ids, attention_mask=mask, max_new_tokens=3)
    first = stepper.start()
    cache = stepper.reorder(first.cache, torch.tensor([1, 1, 0]))
    out = stepper.step(torch.tensor([4, 5, 6]), cache, torch.tensor([1, 1, 0]))
    for i, (row, tok) in enumerate(((1, 4), (1, 5), (0, 6))):
        solo = HFStepper(model, ids[row][mask[row].bool()][None], max_new_tokens=3)
        want = solo.step(torch.tensor([tok]), solo.start().cache)
        torch.testing.assert_close(out.log_probs[i], want.log_probs[0])


def test_an_unpadded_encoder_decoder_batch_steps_more_hypotheses_than_inputs():
    model = _peaked("bart")
    src = torch.tensor([[3, 4, 5, 6, 7], [8, 9, 10, 11, 3]])
    stepper = HFStepper(model, src, max_new_tokens=3)
    cache = stepper.reorder(stepper.start().cache, torch.tensor([0, 0, 0, 1, 1, 1]))
    out = stepper.step(torch.tensor([3, 4, 5, 6, 7, 8]), cache)
    start = model.config.decoder_start_token_id
    for i in range(6):  # against the model's own forward over the whole decoder input
        logits = model(
            input_ids=src[i // 3][None], decoder_input_ids=torch.tensor([[start, 3 + i]])
        ).logits
        torch.testing.assert_close(out.log_probs[i], logits[0, -1].log_softmax(-1))


def test_ragged_encoder_decoder_hypotheses_of_different_lengths():
    """Grouped by decoder length (an encoder-decoder's positions follow its cache), each
    equals the hypothesis stepped alone; with hidden states, each its own."""
    model = _peaked("bart")
    src = torch.tensor([[3, 4, 5, 6], [8, 9, 10, 11]])
    stepper = HFStepper(model, src, max_new_tokens=4, hidden=True)
    c0, c1 = stepper.split(stepper.start().cache)
    c0 = stepper.step_ragged(torch.tensor([5]), [c0], torch.tensor([0]))[0].cache
    outs = stepper.step_ragged(torch.tensor([6, 7]), [c0, c1], torch.tensor([0, 1]))
    for row, path in ((0, [5, 6]), (1, [7])):
        solo = HFStepper(model, src[row][None], max_new_tokens=4, hidden=True)
        want = solo.start()
        for tok in path:
            want = solo.step(torch.tensor([tok]), want.cache)
        assert outs[row].log_probs.shape == (1, V) and outs[row].hidden.shape[0] == 1
        torch.testing.assert_close(outs[row].log_probs, want.log_probs)
        torch.testing.assert_close(outs[row].hidden, want.hidden)


def test_ragged_causal_hypotheses_return_their_own_hidden_states():
    stepper = HFStepper(LLAMA, IDS, attention_mask=MASK, max_new_tokens=3, hidden=True)
    caches = stepper.split(stepper.start().cache)
    outs = stepper.step_ragged(torch.tensor([4, 5]), caches, torch.tensor([0, 1]))
    for row, tok in ((0, 4), (1, 5)):
        solo = HFStepper(LLAMA, IDS[row][MASK[row].bool()][None], max_new_tokens=3, hidden=True)
        want = solo.step(torch.tensor([tok]), solo.start().cache)
        assert outs[row].log_probs.shape == (1, V)
        torch.testing.assert_close(outs[row].log_probs, want.log_probs)
        torch.testing.assert_close(outs[row].hidden, want.hidden)


def test_a_wrappers_hidden_states_are_its_bases():
    """FAME's output keeps the base's own output; the hidden states come from there."""
    fame = small_fame(0, vocab=6)
    ids = torch.tensor([[1, 3, 4]])
    got = HFStepper(fame, ids, max_new_tokens=2, hidden=True).start().hidden
    states = fame.base(input_ids=ids, output_hidden_states=True).hidden_states
    assert got.shape == (1, len(states), states[0].shape[-1])
    torch.testing.assert_close(got, torch.stack([h[:, -1] for h in states], 1).float())


# ---------------------------------------------------------------- a gencraft_step
class _Delegating(nn.Module):
    """A wrapper that steps its base through ``gencraft_step`` and records each call's
    ``start``, ``hidden`` and padding keywords."""

    def __init__(self, base: nn.Module) -> None:
        super().__init__()
        self.base, self.calls = base, []

    def gencraft_step(
        self, tokens, cache, *, start, hidden, attention_mask=None, position_ids=None
    ):
        self.calls.append((start, hidden, attention_mask is not None, position_ids is not None))
        kw = {"attention_mask": attention_mask, "position_ids": position_ids}
        out = self.base(
            input_ids=tokens,
            past_key_values=cache,
            use_cache=True,
            output_hidden_states=hidden,
            **{k: v for k, v in kw.items() if v is not None},
        )
        states = None
        if hidden:
            states = torch.stack([h[:, -1] for h in out.hidden_states], 1).float()
        return StepOutput(out.logits[:, -1].float().log_softmax(-1), out.past_key_values, states)


class _NoMask(_Delegating):
    def gencraft_step(self, tokens, cache, *, start, hidden):
        return super().gencraft_step(tokens, cache, start=start, hidden=hidden)


def test_a_gencraft_step_gets_start_hidden_and_the_padding_of_its_rows():
    """Equal to stepping the base itself, on a padded batch with reordered hypotheses."""
    base = _peaked("gpt2")
    wrapped = _Delegating(base)
    got = HFStepper(wrapped, IDS, attention_mask=MASK, max_new_tokens=3, hidden=True)
    want = HFStepper(base, IDS, attention_mask=MASK, max_new_tokens=3, hidden=True)
    a, b = got.start(), want.start()
    torch.testing.assert_close(a.log_probs, b.log_probs)
    torch.testing.assert_close(a.hidden, b.hidden)
    index = torch.tensor([1, 0])
    a = got.step(torch.tensor([4, 5]), got.reorder(a.cache, index), index)
    b = want.step(torch.tensor([4, 5]), want.reorder(b.cache, index), index)
    torch.testing.assert_close(a.log_probs, b.log_probs)
    torch.testing.assert_close(a.hidden, b.hidden)
    caches = got.split(got.start().cache)
    outs = got.step_ragged(torch.tensor([4, 5]), caches, torch.tensor([0, 1]))
    solo = HFStepper(base, IDS[1][MASK[1].bool()][None], max_new_tokens=3)
    torch.testing.assert_close(
        outs[1].log_probs, solo.step(torch.tensor([5]), solo.start().cache).log_probs
    )
    assert [c[:2] for c in wrapped.calls] == [
        (True, True),
        (False, True),
        (True, True),
        (False, True),
    ]
    assert all(c[0] is True or c[0] is False for c in wrapped.calls)  # a bool, as documented
    assert all(c[2] and c[3] for c in wrapped.calls)  # a padded batch: mask and positions


def test_a_gencraft_step_without_attention_mask_refuses_a_padded_batch_only():
    wrapped = _NoMask(small_llama(0, vocab=V))
    assert _refusal(lambda: HFStepper(wrapped, IDS, attention_mask=MASK, max_new_tokens=1)) == (
        "_NoMask.gencraft_step takes no attention_mask, so it cannot search a padded batch; "
        "pass the inputs one at a time"
    )
    HFStepper(wrapped, IDS, max_new_tokens=1).start()
    HFStepper(wrapped, IDS, attention_mask=torch.ones_like(IDS), max_new_tokens=1).start()


def test_an_encoder_decoder_gencraft_step_gets_no_causal_padding():
    """An encoder-decoder's mask is its encoder's, so a gencraft_step gets no causal
    ``attention_mask``/``position_ids`` (it reaches its encoder itself)."""

    class _Fixed(nn.Module):
        def __init__(self, base):
            super().__init__()
            self.base, self.calls = base, []

        def gencraft_step(self, tokens, cache, *, start, hidden, **padding):
            self.calls.append(sorted(padding))
            return StepOutput(torch.zeros(tokens.shape[0], V).log_softmax(-1), cache)

    wrapped = _Fixed(_peaked("bart"))
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    stepper = HFStepper(
        wrapped, torch.tensor([[3, 4, 5], [6, 7, 0]]), attention_mask=mask, max_new_tokens=2
    )
    stepper.step(torch.tensor([3, 4]), stepper.start().cache)
    assert wrapped.calls == [[], []]


# ---------------------------------------------------------------- processors
class _Seen(LogitsProcessor):
    def __init__(self):
        self.ids = []

    def __call__(self, input_ids, scores):
        self.ids.append(input_ids.clone())
        return scores


def test_a_processor_sees_the_generated_ids_after_the_prefix():
    """A hand-written Stepper has no prefix: the processor sees exactly the generated ids, as
    long integers; an HFStepper's prompts come first, repeated per hypothesis."""
    gen = torch.tensor([[3, 4], [5, 6], [7, 8], [9, 10]])
    for stepper in (_Handwritten(), type("B2", (_Handwritten,), {"batch_size": 2})()):
        seen = _Seen()
        ProcessorChain(stepper, [seen])(torch.zeros(4, V), gen)
        assert seen.ids[0].dtype == torch.long and torch.equal(seen.ids[0], gen)
    seen = _Seen()
    ProcessorChain(HFStepper(LLAMA, IDS, attention_mask=MASK, max_new_tokens=2), [seen])(
        torch.zeros(4, V), gen
    )
    assert torch.equal(seen.ids[0], torch.cat([IDS.repeat_interleave(2, 0), gen], 1))
