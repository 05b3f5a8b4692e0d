"""gencraft's decoders from plain ``generate(custom_generate=...)``: the callables of
``gencraft.search.custom_generate`` and the Hub-ready folders of ``hub/`` (loaded from a
local path, offline, with ``trust_remote_code=True``) give what gencraft's own functions give,
for a padded batch of several inputs, on tiny causal and encoder-decoder models."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gencraft import search
from gencraft.errors import GencraftError
from gencraft.models.architectures import tiny_architecture
from gencraft.search import custom_generate as cg
from gencraft.search.train import classifier_for

HUB = Path(__file__).resolve().parent.parent / "hub"
V = 12
PROMPTS = [[1, 5, 7, 9], [1, 4], [1, 8, 3]]
# gencraft's own searches default to the thesis's scoring; generate's defaults are 1.0 and False
THESIS = {"length_penalty": 0.0, "early_stopping": True}


def _causal(arch="llama"):
    torch.manual_seed(0)
    model = tiny_architecture(arch, vocab_size=V, seed=3)
    with torch.no_grad():  # peaked distributions: searches differ from greedy
        model.get_output_embeddings().weight.mul_(8.0)
    return model


def _left_padded(prompts, pad=0):
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def _expected_rows(model, prompts, found, ids):
    rows = []
    for b, tokens in enumerate(found):
        rows.append(ids[b].tolist() + tokens)
    width = max(map(len, rows))
    # generate's beam search fills with the pad id, or with EOS (2) when the pad id is 0
    return [r + [2] * (width - len(r)) for r in rows]


def _beam_rows(model, prompts, beams, max_new, ids, **kw):
    rows = []
    for p in prompts:
        h = search.beam_search(
            model, torch.tensor([p]), num_beams=beams, max_new_tokens=max_new, **kw
        )[0]
        rows.append(h.tokens + ([h.eos_token] if h.finished else []))
    return _expected_rows(model, prompts, rows, ids)


@pytest.mark.parametrize("beams", [1, 3])
def test_beam_search_from_generate_equals_gencrafts_own_for_a_padded_batch(beams):
    model = _causal()
    ids, mask = _left_padded(PROMPTS)
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        num_beams=beams,
        max_new_tokens=5,
        do_sample=False,
        custom_generate=cg.beam_search,
        **THESIS,
    )
    assert out.tolist() == _beam_rows(model, PROMPTS, beams, 5, ids)


def test_beam_search_with_scores_and_several_returns():
    model = _causal("gpt2")
    ids, mask = _left_padded(PROMPTS[:2])
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        num_beams=3,
        num_return_sequences=2,
        max_new_tokens=4,
        custom_generate=cg.beam_search,
        **THESIS,
        return_dict_in_generate=True,
        output_scores=True,
    )
    assert out.sequences.shape[0] == 4
    want = [
        h.score
        for p in PROMPTS[:2]
        for h in search.beam_search(model, torch.tensor([p]), num_beams=3, max_new_tokens=4)[:2]
    ]
    assert out.sequences_scores.tolist() == pytest.approx(want, abs=1e-5)


def test_exact_mode_from_generate_equals_gencrafts_own():
    model = _causal()
    ids, mask = _left_padded(PROMPTS)
    out = model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=3, custom_generate=cg.exact_mode
    )
    found = []
    for p in PROMPTS:
        r = search.exact_mode(model, torch.tensor([p]), max_new_tokens=3)
        found.append([*r.tokens, 2])
    assert out.tolist() == _expected_rows(model, PROMPTS, found, ids)
    # the method's own arguments are generate() keywords
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=4,
        custom_generate=cg.exact_mode,
        length=2,
    )
    assert all(len([t for t in row[ids.shape[1] :] if t]) <= 3 for row in out.tolist())
    assert out[:, ids.shape[1] + 2].tolist() == [2, 2, 2]


def test_conditional_beam_search_from_generate_equals_gencrafts_own():
    model = _causal()
    torch.manual_seed(1)
    clf = classifier_for(model, "degenerate", d_clf=8, num_heads=2, d_out=4, mlp_hidden=8).eval()
    ids, mask = _left_padded(PROMPTS[:2])
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        num_beams=3,
        max_new_tokens=4,
        custom_generate=cg.conditional_beam_search,
        **THESIS,
        classifier=clf,
        k=4,
        return_dict_in_generate=True,
        output_scores=True,
    )
    rows, scores = [], []
    for p in PROMPTS[:2]:
        h = search.beam_search(
            model, torch.tensor([p]), num_beams=3, max_new_tokens=4, classifier=clf, k=4
        )[0]
        rows.append(h.tokens + ([h.eos_token] if h.finished else []))
        scores.append(h.conditional_score)
    assert out.sequences.tolist() == _expected_rows(model, PROMPTS[:2], rows, ids)
    assert out.sequences_scores.tolist() == pytest.approx(scores, abs=1e-5)
    with pytest.raises(GencraftError, match="needs classifier"):
        model.generate(
            input_ids=ids, attention_mask=mask, custom_generate=cg.conditional_beam_search
        )


def test_encoder_decoder_batch_equals_gencrafts_own():
    model = tiny_architecture("bart", vocab_size=V, seed=2)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    src = torch.tensor([[5, 6, 7, 8, 2], [9, 4, 2, 0, 0]])
    mask = (src != 0).long()
    out = model.generate(
        input_ids=src,
        attention_mask=mask,
        num_beams=2,
        max_new_tokens=4,
        custom_generate=cg.beam_search,
        **THESIS,
    )
    start = model.generation_config.decoder_start_token_id
    rows = []
    for b in range(2):
        h = search.beam_search(
            model, src[b : b + 1, : int(mask[b].sum())], num_beams=2, max_new_tokens=4
        )[0]
        rows.append([start, *h.tokens, *([h.eos_token] if h.finished else [])])
    width = max(map(len, rows))
    assert out.tolist() == [r + [0] * (width - len(r)) for r in rows]


def test_other_stopping_criteria_are_refused_by_name():
    from transformers import StoppingCriteria, StoppingCriteriaList

    class Never(StoppingCriteria):
        def __call__(self, input_ids, scores, **kw):
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    model = _causal()
    ids, mask = _left_padded(PROMPTS[:1])
    with pytest.raises(GencraftError, match="Never"):
        model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=2,
            stopping_criteria=StoppingCriteriaList([Never()]),
            custom_generate=cg.beam_search,
            **THESIS,
        )


@pytest.mark.parametrize(
    "name", ["beam_search", "conditional_beam_search", "exact_mode", "context_aware"]
)
def test_hub_folder_loads_offline_and_equals_the_callable(name, monkeypatch, tmp_path):
    folder = HUB / name
    assert (folder / "custom_generate" / "generate.py").is_file()
    assert (folder / "README.md").is_file()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path))
    model = _causal()
    ids, mask = _left_padded(PROMPTS)
    kw = dict(input_ids=ids, attention_mask=mask, num_beams=2, max_new_tokens=3)
    if name == "conditional_beam_search":
        torch.manual_seed(1)
        kw["classifier"] = classifier_for(model, "degenerate", d_clf=8, num_heads=2, d_out=4).eval()
    if name == "context_aware":  # each row's context-free prompt: its last token
        kw.update(cad_alpha=0.7, negative_input_ids=ids[:, -1:])
    ref = model.generate(**kw, custom_generate=getattr(cg, name))
    got = model.generate(**kw, custom_generate=str(folder), trust_remote_code=True)
    assert torch.equal(got, ref)


@pytest.mark.parametrize("includes", [False, True])
@pytest.mark.parametrize("which", ["beam", "exact"])
def test_length_includes_eos_reaches_the_search(which, includes):
    """``generate(custom_generate=..., length_includes_eos=...)`` gives what gencraft's own
    search gives with that setting, and the two settings differ by one token."""
    model = _causal()
    ids, mask = _left_padded(PROMPTS)
    if which == "beam":
        kw = dict(num_beams=3, max_new_tokens=5, force_length=3, length_includes_eos=includes)
        out = model.generate(
            input_ids=ids, attention_mask=mask, custom_generate=cg.beam_search, **kw
        )
        own = [search.beam_search(model, torch.tensor([p]), **kw)[0] for p in PROMPTS]
    else:
        kw = dict(max_new_tokens=5, length=3, length_includes_eos=includes)
        out = model.generate(
            input_ids=ids, attention_mask=mask, custom_generate=cg.exact_mode, **kw
        )
        own = [search.exact_mode(model, torch.tensor([p]), **kw) for p in PROMPTS]
    found = [[*h.tokens, 2] for h in own]
    assert out.tolist() == _expected_rows(model, PROMPTS, found, ids)
    assert all(len(h.tokens) == (2 if includes else 3) for h in own)


# -- every method argument reaches the search: drawn settings against gencraft's own ---------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from transformers import LogitsProcessorList, SuppressTokensLogitsProcessor  # noqa: E402


def _processors(suppress):
    return LogitsProcessorList([SuppressTokensLogitsProcessor(suppress)]) if suppress else None


@settings(max_examples=8, deadline=None)
@given(
    beams=st.integers(1, 3),
    k=st.integers(1, 6),
    alpha=st.sampled_from([0.0, 0.5, 2.0]),
    finished=st.sampled_from(["aside", "on_beam"]),
    suppress=st.sampled_from([[], [5], [4, 7]]),
)
def test_conditional_arguments_reach_the_search(beams, k, alpha, finished, suppress):
    model = _causal()
    torch.manual_seed(1)
    clf = classifier_for(model, "degenerate", d_clf=8, num_heads=2, d_out=4, mlp_hidden=8).eval()
    ids, mask = _left_padded(PROMPTS[:2])
    kw = {"k": k, "alpha": alpha, "finished": finished}
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        num_beams=beams,
        max_new_tokens=4,
        custom_generate=cg.conditional_beam_search,
        **THESIS,
        classifier=clf,
        logits_processor=_processors(suppress),
        return_dict_in_generate=True,
        output_scores=True,
        **kw,
    )
    rows, scores = [], []
    for p in PROMPTS[:2]:
        h = search.beam_search(
            model,
            torch.tensor([p]),
            num_beams=beams,
            max_new_tokens=4,
            classifier=clf,
            logits_processor=_processors(suppress),
            **kw,
        )[0]
        rows.append(h.tokens + ([h.eos_token] if h.finished else []))
        scores.append(h.conditional_score)
    assert out.sequences.tolist() == _expected_rows(model, PROMPTS[:2], rows, ids)
    assert out.sequences_scores.tolist() == pytest.approx(scores, abs=1e-5)


@settings(max_examples=8, deadline=None)
@given(
    beams=st.integers(1, 3),
    finished=st.sampled_from(["aside", "on_beam"]),
    forced_eos=st.sampled_from(["model", "free"]),
    force_length=st.sampled_from([None, 2, 3]),
)
def test_beam_arguments_reach_the_search(beams, finished, forced_eos, force_length):
    model = _causal()
    ids, mask = _left_padded(PROMPTS)
    kw = {"finished": finished, "forced_eos": forced_eos, "force_length": force_length}
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        num_beams=beams,
        max_new_tokens=4,
        custom_generate=cg.beam_search,
        **THESIS,
        **kw,
    )
    assert out.tolist() == _beam_rows(model, PROMPTS, beams, 4, ids, **kw)


@settings(max_examples=8, deadline=None)
@given(max_nodes=st.integers(1, 30), new=st.integers(1, 4))
def test_exact_arguments_reach_the_search_and_an_empty_search_gives_the_prompt(max_nodes, new):
    model = _causal()
    ids, mask = _left_padded(PROMPTS)
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=new,
        custom_generate=cg.exact_mode,
        max_nodes=max_nodes,
    )
    found = []
    for p in PROMPTS:
        r = search.exact_mode(model, torch.tensor([p]), max_new_tokens=new, max_nodes=max_nodes)
        # no complete output within the budget: the prompt alone
        found.append([] if r.log_prob == float("-inf") else [*r.tokens, 2])
    assert out.tolist() == _expected_rows(model, PROMPTS, found, ids)


@pytest.mark.parametrize("eos", [4, 10])
@pytest.mark.parametrize(
    "scoring",
    [{"length_penalty": 2.0}, {"early_stopping": "never"}, {"length_penalty": -1.0}],
)
def test_one_beam_from_generate_is_generates_greedy_whatever_the_scoring(eos, scoring):
    """``num_beams=1``: generate's greedy path, where a row ends at its first EOS; an explicit
    length penalty or ``early_stopping="never"`` does not turn it into a one-beam search that
    goes on past EOS."""
    model = _causal()
    model.generation_config.eos_token_id = eos
    ids, mask = _left_padded(PROMPTS)
    kw = dict(input_ids=ids, attention_mask=mask, num_beams=1, max_new_tokens=8, do_sample=False)
    greedy = model.generate(**kw, pad_token_id=0)
    assert (greedy == eos).any()  # some row meets EOS before the cap
    out = model.generate(**kw, pad_token_id=0, custom_generate=cg.beam_search, **scoring)
    assert out.tolist() == greedy.tolist()
