"""Context-aware decoding: greedy CAD equals transformers' guidance where the two
coincide; every decode equals a brute-force loop of full forward passes (no cache, no
padding) over both streams, for causal and encoder-decoder models, fixed and adaptive α,
padded context-free prompts; beam CAD's scores are the contrasted log-probabilities of its
outputs, and each row of a batch equals the row alone."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gencraft.errors import GencraftError
from gencraft.models.cad import CADSettings, ContrastStepper, js_divergence
from gencraft.models.stepping import HFStepper
from gencraft.search import beam_search, beam_search_batch
from gencraft.search.custom_generate import context_aware
from tests.search.test_batch import SETTINGS, V, _batch, _model

EOS = 2
prompt = st.lists(st.integers(3, V - 1), min_size=1, max_size=5)


def _lp(model, source: list[int], generated: list[int]) -> torch.Tensor:
    """[V]: log p(next | source, generated) from one full forward pass, no cache, no padding
    (causal: the prompt is the source; encoder-decoder: the encoder input)."""
    with torch.no_grad():
        if model.config.is_encoder_decoder:
            start = model.generation_config.decoder_start_token_id
            dec = torch.tensor([[start, *generated]])
            logits = model(input_ids=torch.tensor([source]), decoder_input_ids=dec).logits
        else:
            logits = model(torch.tensor([source + generated])).logits
    return torch.log_softmax(logits[0, -1].float(), -1)


def _contrast(model, ctx, plain, generated, alpha, adaptive) -> torch.Tensor:
    a, b = _lp(model, ctx, generated), _lp(model, plain, generated)
    if adaptive:  # JSD in bits, straight from its definition, in float64
        pa, pb = a.double().exp(), b.double().exp()
        m = (pa + pb) / 2
        kl = [
            sum(float(x * math.log(x / y)) for x, y in zip(p, m, strict=True) if x > 0)
            for p in (pa, pb)
        ]
        alpha = (kl[0] + kl[1]) / 2 / math.log(2)
    return torch.log_softmax((1 + alpha) * a - alpha * b, -1)


def _greedy_reference(model, ctx, plain, alpha, adaptive, n) -> tuple[list[int], float]:
    out, score = [], 0.0
    for _ in range(n):
        lp = _contrast(model, ctx, plain, out, alpha, adaptive)
        tok = int(lp.argmax())
        out.append(tok)
        score += float(lp[tok])
        if tok == EOS:
            break
    return out, score


def _plain_batch(kind, plains):
    """The context-free inputs: left-padded prompts (causal), right-padded sources (ed)."""
    return _batch(plains, left=kind != "bart")


@settings(max_examples=15, **SETTINGS)
@given(
    kind=st.sampled_from(["llama", "peaked-llama", "gpt2", "bart"]),
    seed=st.integers(0, 2),
    rows=st.lists(st.tuples(prompt, prompt), min_size=1, max_size=3),
    alpha=st.integers(0, 8).map(lambda i: i / 4),
    adaptive=st.booleans(),
    new=st.integers(1, 6),
)
def test_greedy_cad_equals_a_brute_force_loop_on_each_row(kind, seed, rows, alpha, adaptive, new):
    """Rows with their own context and context-free prompts (both padded in the batch)."""
    model = _model(kind, seed)
    model.generation_config.eos_token_id = EOS
    ctxs, plains = [r[0] for r in rows], [r[1] for r in rows]
    ids, mask = _batch(ctxs, left=kind != "bart")
    neg, neg_mask = _plain_batch(kind, plains)
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=new,
        do_sample=False,
        custom_generate=context_aware,
        cad_alpha=alpha,
        cad_adaptive=adaptive,
        negative_input_ids=neg,
        negative_attention_mask=neg_mask,
        pad_token_id=0,
        return_dict_in_generate=True,
        output_scores=True,
        length_penalty=0.0,
    )
    start = 1 if kind == "bart" else ids.shape[1]
    for r in range(len(rows)):
        want, score = _greedy_reference(model, ctxs[r], plains[r], alpha, adaptive, new)
        got = out.sequences[r, start:].tolist()
        assert got[: len(want)] == want and set(got[len(want) :]) <= {0}
        assert float(out.sequences_scores[r]) == pytest.approx(score, abs=1e-3)


@settings(max_examples=15, **SETTINGS)
@given(
    seed=st.integers(0, 2),
    ctx_lengths=st.lists(st.integers(2, 6), min_size=1, max_size=4),
    plain_len=st.integers(1, 4),
    alpha=st.integers(0, 8).map(lambda i: i / 4),
    new=st.integers(1, 6),
    ngram=st.sampled_from([0, 2]),
)
def test_greedy_cad_equals_transformers_guidance(seed, ctx_lengths, plain_len, alpha, new, ngram):
    """Where transformers' classifier-free guidance is CAD (a decoder-only model, context-free
    prompts of equal length): generate(guidance_scale=1 + α, negative_prompt_ids=...), with a
    processor that reads the context stream's ids (n-gram blocking) or none."""
    model = _model("peaked-llama", seed)
    g = torch.Generator().manual_seed(seed)
    ctxs = [torch.randint(3, V, (n,), generator=g).tolist() for n in ctx_lengths]
    neg = torch.randint(3, V, (len(ctxs), plain_len), generator=g)
    ids, mask = _batch(ctxs)
    kw = dict(input_ids=ids, attention_mask=mask, max_new_tokens=new, do_sample=False)
    kw.update(pad_token_id=0, eos_token_id=EOS, no_repeat_ngram_size=ngram)
    ones = torch.ones_like(neg)
    ours = model.generate(
        **kw,
        custom_generate=context_aware,
        cad_alpha=alpha,
        negative_input_ids=neg,
        negative_attention_mask=ones,
    )
    theirs = model.generate(
        **kw,
        guidance_scale=1 + alpha,
        negative_prompt_ids=neg,
        negative_prompt_attention_mask=ones,
    )
    assert torch.equal(ours, theirs)


def _stepper(model, kind, ctxs, plains, alpha, adaptive, new):
    ids, mask = _batch(ctxs, left=kind != "bart")
    neg, neg_mask = _plain_batch(kind, plains)
    a = HFStepper(model, ids, attention_mask=mask, max_new_tokens=new)
    b = HFStepper(model, neg, attention_mask=neg_mask, max_new_tokens=new)
    return ContrastStepper(a, b, CADSettings(alpha, adaptive))


@settings(max_examples=12, **SETTINGS)
@given(
    kind=st.sampled_from(["llama", "gpt2", "bart"]),
    seed=st.integers(0, 2),
    rows=st.lists(st.tuples(prompt, prompt), min_size=2, max_size=3),
    alpha=st.integers(0, 8).map(lambda i: i / 4),
    adaptive=st.booleans(),
    beams=st.integers(2, 4),
    new=st.integers(1, 5),
)
def test_beam_cad_scores_its_outputs_by_the_contrast_and_rows_stand_alone(
    kind, seed, rows, alpha, adaptive, beams, new
):
    """Every hypothesis's score is the sum of the contrasted log-probabilities of its tokens
    (brute force: both caches followed the beams), and a row decodes in the batch as alone."""
    model = _model(kind, seed)
    ctxs, plains = [r[0] for r in rows], [r[1] for r in rows]
    kw = dict(eos_token_id=EOS, num_beams=beams, max_new_tokens=new, length_penalty=0.0)
    together = beam_search_batch(_stepper(model, kind, ctxs, plains, alpha, adaptive, new), **kw)
    for r in range(len(rows)):
        alone = beam_search(
            _stepper(model, kind, ctxs[r : r + 1], plains[r : r + 1], alpha, adaptive, new), **kw
        )
        assert [h.tokens for h in together[r]] == [h.tokens for h in alone]
        for h in together[r]:
            toks = h.tokens + ([h.eos_token] if h.finished else [])
            want = sum(
                float(_contrast(model, ctxs[r], plains[r], toks[:t], alpha, adaptive)[toks[t]])
                for t in range(len(toks))
            )
            assert h.score == pytest.approx(want, abs=1e-3)


def test_js_divergence_and_refusals():
    a = torch.log(torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]))
    b = torch.log(torch.tensor([[0.0, 0.5, 0.5], [0.2, 0.3, 0.5]]))
    # disjoint halves: JSD = 0.5 bit; equal distributions: 0
    assert js_divergence(a, b).tolist() == pytest.approx([0.5, 0.0], abs=1e-6)
    far = torch.log(torch.tensor([[0.0, 0.0, 1.0]]))
    assert js_divergence(a[:1], far).item() == pytest.approx(1.0, abs=1e-6)  # disjoint
    model = _model("llama", 0)
    ids = torch.tensor([[3, 4]])
    with pytest.raises(GencraftError, match="context_aware needs negative_input_ids"):
        model.generate(input_ids=ids, max_new_tokens=2, custom_generate=context_aware)
    with pytest.raises(GencraftError, match="context-free stream holds 2 inputs"):
        model.generate(
            input_ids=ids,
            max_new_tokens=2,
            custom_generate=context_aware,
            negative_input_ids=torch.tensor([[3], [4]]),
        )
    with pytest.raises(GencraftError, match="cad alpha takes a finite weight A >= 0"):
        model.generate(
            input_ids=ids,
            max_new_tokens=2,
            custom_generate=context_aware,
            cad_alpha=-1.0,
            negative_input_ids=torch.tensor([[3]]),
        )


def test_the_cad_speed_benchmark_runs_at_tiny_scale(shared_data, tmp_path):
    from gencraft.studies.runner import reproduce

    report = reproduce(
        "search-cad-speed", scale="tiny", output=tmp_path, overrides={"data_dir": str(shared_data)}
    ).read_text()
    assert "| beam s | CAD beam s | ratio | target |" in report
    assert "| generate beam s | paired CAD s | ratio | target |" in report
    assert "2 prompts in left-padded batches of 8" in report


@pytest.mark.parametrize("alpha", [0.0, 0.7])
def test_fame_plus_cad_keeps_fame_s_source_state(alpha):
    """FAME + CAD: the context-free stream (FAME's base on its own prompt) steps between FAME's
    steps without disturbing FAME's source state: at α = 0 it is FAME's own beam search, and
    at α > 0 every score is the contrast of FAME's and the base's log-probabilities computed
    from scratch."""
    from method_testing import small_fame

    fame = small_fame(2, vocab=V)
    ids, mask = _batch([[3, 4, 5, 6], [7, 8]])
    neg, neg_mask = _batch([[9], [10, 11]])
    kw = dict(num_beams=3, max_new_tokens=4, eos_token_id=0, length_penalty=0.0)
    streams = (
        HFStepper(fame, ids, attention_mask=mask, max_new_tokens=4),
        HFStepper(fame.base, neg, attention_mask=neg_mask, max_new_tokens=4),
    )
    got = beam_search_batch(
        ContrastStepper(*streams, CADSettings(alpha), plain_guard=fame.bypassed), **kw
    )
    if alpha == 0:
        assert got == beam_search_batch(fame, ids, mask, **kw)
        return

    def forced(model, prompt, toks):  # [T, V]: each step's log-probs, one row alone
        stepper = HFStepper(model, torch.tensor([prompt]), max_new_tokens=4)
        out, rows = stepper.start(), []
        for t in toks:
            rows.append(out.log_probs[0])
            out = stepper.step(torch.tensor([t]), out.cache)
        return rows

    for r, (ctx, plain) in enumerate((([3, 4, 5, 6], [9]), ([7, 8], [10, 11]))):
        for h in got[r]:  # FAME alone on its prompt, then the base alone on its own
            toks = h.tokens + ([h.eos_token] if h.finished else [])
            a_rows = forced(fame, ctx, toks)
            with fame.bypassed() as base:  # the base alone: no focus bias, FAME's state kept
                b_rows = forced(base, plain, toks)
            want = sum(
                float(torch.log_softmax((1 + alpha) * a - alpha * b, -1)[t])
                for a, b, t in zip(a_rows, b_rows, toks, strict=True)
            )
            assert h.score == pytest.approx(want, abs=1e-3)
    # without the guard, the base's calls overwrite FAME's source: the scores differ
    unguarded = beam_search_batch(
        ContrastStepper(
            *streams[:1],
            HFStepper(fame.base, neg, attention_mask=neg_mask, max_new_tokens=4),
            CADSettings(alpha),
        ),
        **kw,
    )
    assert unguarded != got


def test_focus_vs_cad_runs_at_tiny_scale(shared_data, tmp_path):
    from gencraft.studies.runner import reproduce

    report = reproduce(
        "focus-vs-cad", scale="tiny", output=tmp_path, overrides={"data_dir": str(shared_data)}
    ).read_text()
    units = json.loads((tmp_path / "results.json").read_text())["units"]
    assert sorted(units) == sorted(
        ["train baseline", "train fame"]
        + [f"decode {s}" for s in ("base", "FAME", "CAD", "FAME+CAD")]
    )
    assert all(len(units[f"decode {s}"]) == 3 for s in ("base", "CAD"))  # 3 test documents
    assert "| FAME+CAD | R1 precision vs doc | 3 |" in report and "No-conflict control" in report


def test_focus_generate_with_cad_alpha_is_cad_beam_search(shared_data, capsys):
    """``focus generate --cad-alpha``: each document's summary is focus-vs-cad's CAD beam
    search (the model against itself on an empty source), batches as one process cuts them."""
    from gencraft.cli.focus import cad_summaries
    from gencraft.cli.main import main
    from gencraft.data import load_summarization
    from gencraft.models import load_model

    args = ["focus", "generate", "tiny-llama", "--limit", "3", "--batch-size", "2"]
    args += ["--max-new-tokens", "4", "--max-source", "24", "--num-beams", "2"]
    args += ["--data-dir", str(shared_data), "--json", "--quiet", "--cad-alpha", "2"]
    assert main(args) == 0
    got = [json.loads(line)["prediction"] for line in capsys.readouterr().out.splitlines()]
    model, tok = load_model("tiny-llama")
    docs = [d.document for d in load_summarization("xsum", "test", str(shared_data))[:3]]
    s = dict(num_beams=2, max_source=24, max_new_tokens=4, batch_size=2)
    with torch.no_grad():
        assert got == cad_summaries(model, tok, docs, cad_alpha=2.0, **s)
        # the same from generate(custom_generate=context_aware), generate's beam defaults
        from gencraft.focus.data import SummaryEncoder, collate

        enc = SummaryEncoder(tok, False, max_source=24)
        pad = tok.pad_token_id if tok.pad_token_id is not None else enc.eos_id
        want = []
        for i in (0, 2):
            ctx = collate(
                [{"input_ids": enc.encode(d)["input_ids"]} for d in docs[i : i + 2]], pad, left=True
            )
            plain = collate(
                [{"input_ids": enc.encode("")["input_ids"]}] * len(ctx["input_ids"]), pad, left=True
            )
            out = model.generate(
                input_ids=ctx["input_ids"],
                attention_mask=ctx["attention_mask"],
                num_beams=2,
                max_new_tokens=4,
                custom_generate=context_aware,
                cad_alpha=2.0,
                negative_input_ids=plain["input_ids"],
                negative_attention_mask=plain["attention_mask"],
                eos_token_id=enc.eos_id,
                pad_token_id=pad,
            )
            new = out[:, ctx["input_ids"].shape[1] :]
            want += [t.strip() for t in tok.batch_decode(new, skip_special_tokens=True)]
        assert got == want  # (the random tiny model writes the same with or without CAD)
    assert main([*args[:-1], "-1"]) == 2
    assert "--cad-alpha takes a finite weight A >= 0" in capsys.readouterr().err


def test_cad_settings_are_frozen_and_checked_once_when_built():
    import dataclasses

    from gencraft.models.cad import context_free_inputs

    assert CADSettings() == CADSettings(0.5, False)  # CAD's usual α
    with pytest.raises(dataclasses.FrozenInstanceError):
        CADSettings().alpha = 2.0
    for bad in (-0.5, float("inf"), float("nan")):
        with pytest.raises(
            GencraftError, match=f"^cad alpha takes a finite weight A >= 0, got {bad}$"
        ):
            CADSettings(bad)
    assert CADSettings(0.0).alpha == 0.0 and CADSettings(-1.0, adaptive=True).adaptive
    a = HFStepper(_model("llama", 0), torch.tensor([[3, 4]]), max_new_tokens=2)
    with pytest.raises(
        GencraftError, match=r"^CAD takes a CADSettings\(alpha, adaptive\), got 0.5$"
    ):
        ContrastStepper(a, a, 0.5)
    # the context-free inputs: an empty row stands in as one token, padded on the model's side
    ids, mask = context_free_inputs([[5, 6], [], [7]], 0, left=True, empty=9)
    assert ids.tolist() == [[5, 6], [0, 9], [0, 7]] and mask.tolist() == [[1, 1], [0, 1], [0, 1]]
    ids, mask = context_free_inputs([[], [7, 8]], 1, left=False, empty=2)
    assert ids.tolist() == [[2, 1], [7, 8]] and mask.tolist() == [[1, 0], [1, 1]]


def test_the_two_streams_step_named_rows_and_give_the_context_s_hidden_states():
    """A step with explicit ``rows`` steps each stream on those rows (here the two inputs'
    hypotheses swapped against the default blocks), the hidden states are the context
    stream's, and streams of different vocabularies are refused word for word."""
    from method_testing import small_llama

    model = _model("llama", 3)
    ids, mask = _batch([[3, 4, 5], [6, 7]])
    neg, neg_mask = _batch([[8], [9, 10]])

    def streams():
        return (
            HFStepper(model, ids, attention_mask=mask, max_new_tokens=3, hidden=True),
            HFStepper(model, neg, attention_mask=neg_mask, max_new_tokens=3, hidden=True),
        )

    pair = ContrastStepper(*streams(), CADSettings(1.5))
    first = pair.start()
    a, b = streams()
    a0, b0 = a.start(), b.start()
    assert torch.equal(first.hidden, a0.hidden) and not torch.equal(first.hidden, b0.hidden)
    rows = torch.tensor([1, 0])  # hypothesis 0 continues input 1, hypothesis 1 input 0
    tokens = torch.tensor([2, 5])
    got = pair.step(tokens, pair.reorder(first.cache, rows), rows)
    want_a = a.step(tokens, a.reorder(a0.cache, rows), rows)
    want_b = b.step(tokens, b.reorder(b0.cache, rows), rows)
    want = torch.log_softmax(2.5 * want_a.log_probs - 1.5 * want_b.log_probs, -1)
    torch.testing.assert_close(got.log_probs, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got.hidden, want_a.hidden)
    with pytest.raises(GencraftError) as err:
        ContrastStepper(
            HFStepper(model, ids, attention_mask=mask, max_new_tokens=3),
            HFStepper(small_llama(0, vocab=V + 3), ids, attention_mask=mask, max_new_tokens=3),
        )
    assert str(err.value) == "the two streams' models have different vocabularies"
