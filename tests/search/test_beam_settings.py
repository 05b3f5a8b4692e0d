"""search/beam.py's settings and refusals word for word, and what each entry point passes on:
the paths mutmut found that no output-comparing test reads."""

from __future__ import annotations

import dataclasses
import sys
import warnings
from typing import NamedTuple

import pytest
import torch
from method_testing import small_llama
from test_search import EosPenalty, TableStepper
from transformers import LogitsProcessor, TemperatureLogitsWarper

from gencraft.errors import GencraftError
from gencraft.search import StepOutput, beam_search, beam_search_batch, beam_search_tensors
from gencraft.search.beam import BeamSettings


class _Built(NamedTuple):
    """What a search of ``rows`` rows reads of its settings."""

    settings: BeamSettings
    max_new_tokens: tuple[int, ...]
    force_length: tuple[int | None, ...]

    def __getattr__(self, name):
        return getattr(self.settings, name)


def _build(rows=2, max_new_tokens=4, force_length=None, includes_eos=False, **kw):
    kw.setdefault("num_beams", 2)
    s = BeamSettings(
        max_new_tokens=max_new_tokens,
        force_length=force_length,
        length_includes_eos=includes_eos,
        **kw,
    )
    return _Built(s, *s.rows(rows))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (dict(max_new_tokens=[3, 4, 5]), "max_new_tokens gives 3 values for 2 rows"),
        (dict(force_length=[1]), "force_length gives 1 values for 2 rows"),
        (dict(finished="last"), "finished must be one of 'aside', 'on_beam', got 'last'"),
        (dict(forced_eos="paid"), "forced_eos must be one of 'model', 'free', got 'paid'"),
        (
            dict(forced_ranking="clf"),
            "forced_ranking must be one of 'score', 'selection', got 'clf'",
        ),
        (
            dict(early_stopping=1),
            "early_stopping must be one of True, False, 'never', got 1",
        ),
        (dict(num_beams=0), "num_beams must be >= 1, got 0"),
        (dict(alpha=-0.5), "alpha must be >= 0, got -0.5"),
        (
            dict(length_penalty=float("inf")),
            "length_penalty must be a finite number in (-1e4, 1e4), got inf",
        ),
        (
            dict(force_length=0, includes_eos=True),
            "force_length=0 with length_includes_eos: the EOS alone is 1",
        ),
        (
            dict(force_length=4),
            "force_length=4 needs 0 <= force_length < max_new_tokens (4): the EOS after the n "
            "tokens counts as a new token",
        ),
        (
            dict(finished="on_beam", length_penalty=1.0),
            "finished='on_beam' (the thesis's Alg. 1) ranks by the summed score and stops when "
            "every slot is complete: it takes length_penalty=0.0 and early_stopping=True, got "
            "1.0 and True",
        ),
    ],
)
def test_bad_settings_are_refused_in_one_line_naming_the_value(call, message):
    with pytest.raises(GencraftError) as err:
        _build(**call)
    assert str(err.value) == message


def test_allowed_values_are_compared_by_value_and_type_and_counted_as_documented():
    """A setting built at run time (not the interned literal) is accepted; a forced length of 1
    counted with its EOS is 0 tokens before it; one value stands for every row."""
    built = _build(
        finished="".join(["on_", "beam"]),
        forced_eos="".join(["fr", "ee"]),
        forced_ranking="".join(["sel", "ection"]),
        force_length=1,
        includes_eos=True,
    )
    assert (built.finished, built.forced_eos, built.forced_ranking) == (
        "on_beam",
        "free",
        "selection",
    )
    assert built.force_length == (0, 0)
    assert _build(early_stopping="".join(["nev", "er"])).early_stopping == "never"
    assert _build(force_length=[2, None], max_new_tokens=[3, 5]).force_length == (2, None)
    assert _build(rows=3, max_new_tokens=6).max_new_tokens == (6, 6, 6)
    with pytest.raises(GencraftError, match="got False"):
        _build(finished=False)


class _Disabled(EosPenalty):
    enabled = False


def test_a_disabled_classifier_is_plain_search_and_k_follows_the_classifier():
    """A classifier that says ``enabled = False`` is dropped with its k, so the search is the
    plain one; without a classifier k stays None (all V), with one it becomes V."""
    off = _build(classifier=_Disabled(), k=2)
    assert off.classifier is None and off.k is None
    assert off.for_vocabulary(3).k is None
    on = _build(classifier=EosPenalty())
    assert on.classifier is not None and on.for_vocabulary(3).k == 3
    assert _build(classifier=EosPenalty(), k=2).for_vocabulary(3).k == 2
    kw = dict(num_beams=2, max_new_tokens=3, eos_token_id=0)
    plain = beam_search(TableStepper(), **kw)
    disabled = beam_search(TableStepper(), classifier=_Disabled(), k=1, **kw)
    assert [(h.tokens, h.score) for h in disabled] == [(h.tokens, h.score) for h in plain]


def test_every_entry_point_takes_a_settings_object_and_its_fields_as_overrides():
    """The three entries take a :class:`BeamSettings`, its fields as keywords (replacing the
    object's, or building it), and refuse an unknown name or a missing required one in one
    line; the settings are frozen and compare by value."""
    kw = dict(eos_token_id=0)
    s = BeamSettings(num_beams=2, max_new_tokens=3)
    want = [
        (h.tokens, h.score)
        for h in beam_search(TableStepper(), num_beams=2, max_new_tokens=3, **kw)
    ]
    for got in (
        beam_search(TableStepper(), None, s, **kw),
        beam_search_batch(TableStepper(), settings=s, **kw)[0],
        beam_search_tensors(TableStepper(), settings=s, **kw).hypotheses()[0],
        beam_search(
            TableStepper(), settings=BeamSettings(num_beams=5, max_new_tokens=3), num_beams=2, **kw
        ),
    ):
        assert [(h.tokens, h.score) for h in got] == want
    one = beam_search(TableStepper(), settings=s, num_beams=1, **kw)
    assert len(one) == 1 and s.num_beams == 2  # an override leaves the object as it was
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.num_beams = 3
    assert s == BeamSettings(2, 3, logits_processor=None) and s.logits_processor == ()
    assert BeamSettings(2, [3, 4]).max_new_tokens == (3, 4)  # a per-row list, as a tuple
    for fn in (beam_search, beam_search_batch, beam_search_tensors):
        with pytest.raises(GencraftError) as err:
            fn(TableStepper(), settings=s, beams=3, **kw)
        assert str(err.value).startswith("beam search has no setting 'beams'; BeamSettings has ")
        with pytest.raises(GencraftError) as err:
            fn(TableStepper(), num_beams=2, **kw)
        assert str(err.value) == "beam search needs max_new_tokens (or settings=BeamSettings(...))"
    with pytest.raises(GencraftError, match=r"^max_new_tokens gives 2 values, force_length 3; "):
        BeamSettings(2, [3, 4], force_length=[1, 1, 1])
    with pytest.raises(GencraftError, match=r"^force_length=3 needs 0 <= force_length < max"):
        BeamSettings(2, [3, 4], force_length=3)  # checked when built, per row


def test_settings_from_a_generation_config_are_generate_s():
    """``from_generation_config``: the config's beams, length penalty and early stopping with
    generate's defaults (1.0, False); one beam is generate's greedy (0.0, True); its
    max_new_tokens unless the method gives one; the method's own fields on top."""
    from transformers import GenerationConfig

    c = GenerationConfig(num_beams=3, max_new_tokens=7)
    assert BeamSettings.from_generation_config(c) == BeamSettings(
        3, 7, length_penalty=1.0, early_stopping=False
    )
    c = GenerationConfig(num_beams=3, max_new_tokens=7, length_penalty=-0.5, early_stopping="never")
    s = BeamSettings.from_generation_config(c, max_new_tokens=5, finished="aside")
    assert (s.num_beams, s.max_new_tokens, s.length_penalty, s.early_stopping) == (
        3,
        5,
        -0.5,
        "never",
    )
    c = GenerationConfig(num_beams=1, max_new_tokens=4, length_penalty=2.0, early_stopping="never")
    assert BeamSettings.from_generation_config(c) == BeamSettings(1, 4)  # greedy
    c = GenerationConfig(max_length=20)
    with pytest.raises(GencraftError, match=r"^beam search needs max_new_tokens"):
        BeamSettings.from_generation_config(c)
    assert BeamSettings.from_generation_config(c, max_new_tokens=9).max_new_tokens == 9


class _Unknown(LogitsProcessor):
    def __call__(self, input_ids, scores):
        return scores


class _Declared(_Unknown):
    shift_invariant = True


def _warned(processors, num_beams):
    model = small_llama(0, vocab=6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        beam_search_batch(  # through the batch entry: the warning still points here
            model,
            torch.tensor([[1, 2]]),
            num_beams=num_beams,
            max_new_tokens=2,
            logits_processor=processors,
        )
    return [w for w in caught if "num_beams=1" in str(w.message)]


def test_one_beam_warns_for_a_processor_that_may_depend_on_the_offset():
    """Greedy (one beam) with a processor whose choice may change when a constant is added
    warns once, naming it, at the caller's line; a processor that declares
    ``shift_invariant = True`` or is known to be, or several beams, does not."""
    [w] = _warned([_Unknown(), _Declared(), TemperatureLogitsWarper(0.5)], 1)
    assert str(w.message) == (
        "beam_search with num_beams=1 applies _Unknown, TemperatureLogitsWarper to "
        "log-probabilities, as generate's beam search does; generate's greedy path applies it "
        "to raw logits, so the two can choose differently"
    )
    # (under mutmut, its trampolines sit between the caller and the search's frames)
    assert w.filename == __file__ or "mutmut.mutation.trampoline" in sys.modules
    assert _warned([_Declared()], 1) == []
    assert _warned([_Unknown()], 2) == []


class _WrongRows(TableStepper):
    def start(self):
        return StepOutput(self._lp([(), ()]), [(), ()])


class _WideHidden(TableStepper):
    def start(self):
        return StepOutput(self._lp([()]), [()], torch.zeros(1, 4, 5))


class _Reads(EosPenalty):
    num_layers, hidden_size = 2, 3


@pytest.mark.parametrize(
    ("stepper", "clf", "message"),
    [
        (_WrongRows(), None, "the stepper holds 1 inputs but started 2 rows"),
        (TableStepper(), _Reads(), "this model gives no hidden states for the classifier"),
        (
            _WideHidden(),
            _Reads(),
            "the classifier reads 2 layers x 3 hidden states, but this model gives 4 x 5: it "
            "was trained for another model",
        ),
    ],
)
def test_a_stepper_that_does_not_fit_is_refused_at_the_start(stepper, clf, message):
    with pytest.raises(GencraftError) as err:
        beam_search(stepper, num_beams=2, max_new_tokens=3, eos_token_id=0, classifier=clf)
    assert str(err.value) == message


@pytest.mark.parametrize("early_stopping", [False, "never"])
def test_beam_search_passes_early_stopping_and_refuses_a_1d_prompt(early_stopping):
    """beam_search is the batch of one of beam_search_batch under a non-default stopping
    rule; a 1-D prompt is refused, naming its shape."""
    model = small_llama(3, vocab=8)
    kw = dict(num_beams=3, max_new_tokens=5, length_penalty=1.5, early_stopping=early_stopping)
    for prompt in ([1, 2, 3], [4], [5, 6]):
        one = beam_search(model, torch.tensor([prompt]), **kw)
        [batch] = beam_search_batch(model, torch.tensor([prompt]), **kw)
        assert [(h.tokens, h.score) for h in one] == [(h.tokens, h.score) for h in batch]
    with pytest.raises(GencraftError) as err:
        beam_search_tensors(model, torch.tensor([1, 2, 3]), **kw)
    assert str(err.value) == "input_ids must have shape [B, P] with B, P >= 1, got [3]"


def test_k_is_checked_against_the_vocabulary_at_both_ends_and_unknown_names_listed():
    """``k`` from 1 to V is taken (V: every continuation), 0 and V + 1 are refused word for
    word; several unknown names are listed in one line."""
    for k in (1, 3):
        assert _build(classifier=EosPenalty(), k=k).for_vocabulary(3).k == k
    for k in (0, 4):
        with pytest.raises(GencraftError) as err:
            _build(classifier=EosPenalty(), k=k).for_vocabulary(3)
        assert str(err.value) == f"k must be in [1, vocab size 3], got {k}"
    with pytest.raises(GencraftError) as err:
        beam_search_batch(TableStepper(), num_beams=2, max_new_tokens=3, beams=2, width=1)
    assert str(err.value).startswith("beam search has no setting 'beams', 'width'; BeamSettings ")


@pytest.mark.parametrize(
    ("field", "bad", "shown"),
    [
        ("max_new_tokens", 3.5, "3.5"),
        ("max_new_tokens", [3, "a"], "'a'"),
        ("max_new_tokens", "abc", "'abc'"),
        ("max_new_tokens", None, "None"),
        ("force_length", [1, 2.0], "2.0"),
        ("force_length", 1.5, "1.5"),
    ],
)
def test_lengths_are_integers_once_or_per_row(field, bad, shown):
    """numpy integers are ints (per row, with None for no forced length); anything else is
    refused in one line naming the value, never truncated."""
    import numpy as np

    s = BeamSettings(2, [np.int64(3), 4], force_length=[None, np.int32(1)])
    assert s.max_new_tokens == (3, 4) and s.force_length == (None, 1)
    assert type(s.max_new_tokens[0]) is int and BeamSettings(2, np.int64(5)).max_new_tokens == 5
    kw = {"max_new_tokens": 6, field: bad}
    with pytest.raises(GencraftError) as err:
        BeamSettings(2, **kw)
    assert str(err.value) == f"{field} takes an integer or one per row, got {shown}"
