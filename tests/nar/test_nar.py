"""RUM-SUNDAE (gencraft.nar): the MLM -> encoder-decoder conversion, the SUNDAE and
Mask-Predict objectives against hand computations, the samplers, a tiny model that learns, the
CLI and bad input."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from gencraft.cli.main import main
from gencraft.errors import GencraftError
from gencraft.models import load_model
from gencraft.nar import NARSeq2Seq, SamplingConfig, load_mlm_seq2seq, mlm_to_seq2seq
from gencraft.nar.decoding import (
    autoregressive_generate,
    mask_predict_generate,
    sundae_generate,
    sundae_step,
)
from gencraft.nar.functional import (
    collate,
    corrupt,
    mask_predict_loss,
    noise_ids,
    sundae_loss,
)


@pytest.fixture(scope="module")
def tiny():
    return load_mlm_seq2seq("tiny-bert", seed=3, max_target_length=24)


def _batch(tok, pairs):
    return collate([(tok(s).input_ids, tok(t).input_ids) for s, t in pairs], tok.pad_token_id)


# ------------------------------------------------------------------ conversion
@pytest.mark.parametrize("cross", ["random", "copy"])
def test_encoder_and_decoder_start_from_the_mlm(cross):
    mlm, _ = load_model("tiny-bert", task="masked-lm", seed=5)
    ref = mlm.state_dict()
    model = mlm_to_seq2seq("tiny-bert", seed=5, cross_attention=cross)
    assert isinstance(model, NARSeq2Seq)
    for k, v in model.encoder.state_dict().items():
        assert torch.equal(v, ref["bert." + k]), k
    dec = model.decoder.state_dict()
    for k, v in dec.items():
        if "crossattention" not in k:
            assert torch.equal(v, ref[k]), k
    # the output layer is tied to the decoder's word embeddings, as in the MLM
    assert model.decoder.cls.predictions.decoder.weight is (
        model.decoder.bert.embeddings.word_embeddings.weight
    )
    for i, layer in enumerate(model.decoder.bert.encoder.layer):
        same = torch.equal(
            layer.crossattention.self.query.weight, layer.attention.self.query.weight
        )
        assert same == (cross == "copy"), i
    scratch = mlm_to_seq2seq("tiny-bert", seed=5, pretrained=False)
    emb = "embeddings.word_embeddings.weight"
    enc_emb = scratch.encoder.state_dict()[emb]
    assert not torch.equal(enc_emb, ref["bert." + emb])
    assert not torch.equal(enc_emb, scratch.decoder.bert.state_dict()[emb])


def test_the_same_seed_gives_the_same_model():
    a = mlm_to_seq2seq("tiny-bert", seed=1)
    b = mlm_to_seq2seq("tiny-bert", seed=1)
    for (k, v), w in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(v, w), k


def _logits(model, src, y, mask=None):
    with torch.no_grad():
        return model(input_ids=src, decoder_input_ids=y, decoder_attention_mask=mask).logits


def test_the_decoder_is_bidirectional_and_survives_save_and_load(tmp_path):
    """With and without a padded decoder batch: without padding sdpa gets no mask (and reads
    the modules' is_causal), with it the mask builder's own mask counts."""
    torch.manual_seed(0)
    src = torch.randint(5, 200, (2, 7))
    y = torch.randint(5, 200, (2, 6))
    padded = torch.ones_like(y)
    padded[1, 4:] = 0  # row 1 has 4 tokens
    last = torch.tensor([5, 3])
    y2 = y.clone()
    y2[torch.arange(2), last] = (y[torch.arange(2), last] + 1) % 200 + 5
    for bidirectional in (True, False):
        model = mlm_to_seq2seq("tiny-bert", seed=0, bidirectional=bidirectional)
        for mask in (None, padded):
            first = _logits(model, src, y, mask)[:, 0]
            changed = _logits(model, src, y2, mask)[:, 0]
            # changing the last token reaches position 0 only without the causal mask
            for row in range(2):
                moved = not torch.allclose(first[row], changed[row], atol=1e-6)
                assert moved == bidirectional, (bidirectional, mask is not None, row)
        y3 = y.clone()
        y3[1, 5] = 77  # a padded position: the valid ones never see it
        same = _logits(model, src, y3, padded)[1, :4]
        assert torch.equal(same, _logits(model, src, y, padded)[1, :4])
        model.save_pretrained(tmp_path / str(bidirectional))
        back = NARSeq2Seq.from_pretrained(tmp_path / str(bidirectional))
        assert back.nar_settings.bidirectional == bidirectional
        assert torch.allclose(_logits(back, src, y2), _logits(model, src, y2), atol=1e-6)
        assert torch.equal(back.length_head.weight, model.length_head.weight)


def test_forward_labels_score_the_same_positions(tiny):
    """EncoderDecoderModel's loss with labels = the denoising cross-entropy (no shift)."""
    model, tok = tiny
    b = _batch(tok, [("name : A", "A is good"), ("x", "yz")])
    labels = b["targets"].masked_fill(~b["target_mask"], -100)
    out = model(
        input_ids=b["input_ids"],
        attention_mask=b["attention_mask"],
        decoder_input_ids=b["targets"],
        decoder_attention_mask=b["target_mask"].long(),
        labels=labels,
    )
    want = F.cross_entropy(out.logits[b["target_mask"]], b["targets"][b["target_mask"]])
    assert out.loss.item() == pytest.approx(want.item(), rel=1e-5)


# ------------------------------------------------------------------ objectives
def test_corruption_rates_follow_alpha():
    g = torch.Generator().manual_seed(0)
    noise = torch.arange(5, 261)
    targets = torch.full((64, 4000), 7)
    mask = torch.ones_like(targets, dtype=torch.bool)
    mask[:, 3000:] = False
    corrupted, alpha, replaced = corrupt(targets, mask, noise, g)
    rate = replaced[:, :3000].float().mean(1)
    assert torch.allclose(rate, alpha, atol=0.035)  # binomial sd <= 0.009 at 3000 positions
    assert not replaced[:, 3000:].any() and (corrupted[:, 3000:] == 7).all()
    assert ((corrupted == 7) | replaced).all()
    assert (corrupted[replaced] >= 5).all()  # noise never draws a special token
    # alpha ~ U(0, 1): mean 1/2, spread over the whole interval
    many = corrupt(targets[:, :2], mask[:, :2], noise, g)[1]
    more = torch.cat(
        [many, *[corrupt(targets[:, :2], mask[:, :2], noise, g)[1] for _ in range(30)]]
    )
    assert abs(more.mean().item() - 0.5) < 0.03 and more.min() < 0.02 and more.max() > 0.98


def test_the_second_unrolled_step_sees_a_sample_of_the_first(tiny):
    model, tok = tiny
    b = _batch(tok, [("name : A", "A is good"), ("x", "a b c d e f")])
    noise = noise_ids(tok)
    out = sundae_loss(model, b, noise=noise, generator=torch.Generator().manual_seed(7))
    # by hand with the same draws: corrupt, predict, sample, predict
    g = torch.Generator().manual_seed(7)
    y, mask = b["targets"], b["target_mask"]
    y0, _, _ = corrupt(y, mask, noise, g)
    enc = model.encode(b["input_ids"], b["attention_mask"]).last_hidden_state
    logits0 = model.decode_logits(y0, enc, b["attention_mask"], mask.long())
    probs = torch.softmax(logits0.detach().float(), -1)
    y1 = torch.multinomial(probs.view(-1, probs.shape[-1]), 1, generator=g).view_as(y)
    y1 = torch.where(mask, y1, y)
    assert torch.equal(out.inputs[0], y0) and torch.equal(out.inputs[1], y1)
    assert not torch.equal(y1[mask], y0[mask])
    logits1 = model.decode_logits(y1, enc, b["attention_mask"], mask.long())
    ce = [F.cross_entropy(lg[mask], y[mask]) for lg in (logits0, logits1)]
    lengths = F.cross_entropy(model.length_logits(enc, b["attention_mask"]), b["lengths"])
    want = (ce[0] + ce[1]) / 2 + 0.1 * lengths
    assert out.loss.item() == pytest.approx(want.item(), rel=1e-5)
    # gradients reach the model through both steps' predictions, never through the sample
    model.zero_grad()
    out.loss.backward()
    assert model.length_head.weight.grad.abs().sum() > 0
    assert model.decoder.bert.encoder.layer[0].crossattention.self.query.weight.grad.abs().sum() > 0
    model.zero_grad()


def test_mask_predict_masks_between_one_and_all_and_scores_only_those(tiny):
    model, tok = tiny
    b = _batch(tok, [("name : A", "A is good"), ("x", "ab"), ("y", "a long enough target")])
    mask_id = tok.mask_token_id
    for seed in range(5):
        out = mask_predict_loss(
            model, b, mask_id=mask_id, generator=torch.Generator().manual_seed(seed)
        )
        masked = out.inputs[0] == mask_id
        n = masked.sum(1)
        assert (n >= 1).all() and (n <= b["lengths"]).all()
        assert not (masked & ~b["target_mask"]).any()
        enc = model.encode(b["input_ids"], b["attention_mask"]).last_hidden_state
        logits = model.decode_logits(
            out.inputs[0], enc, b["attention_mask"], b["target_mask"].long()
        )
        want = F.cross_entropy(logits[masked], b["targets"][masked])
        assert out.parts["tokens"] == pytest.approx(want.item(), rel=1e-5)


# ------------------------------------------------------------------ decoding
def test_update_proportion_zero_changes_nothing_and_one_takes_every_new_token(tiny):
    model, tok = tiny
    b = _batch(tok, [("name : A", "A is good"), ("x", "abc")])
    enc = model.encode(b["input_ids"], b["attention_mask"]).last_hidden_state
    y, mask = b["targets"], b["target_mask"]
    g = torch.Generator().manual_seed(0)
    kept, logits = sundae_step(
        model, y, mask, enc, b["attention_mask"], proportion=0.0, generator=g
    )
    assert torch.equal(kept, y)
    arg, logits = sundae_step(model, y, mask, enc, b["attention_mask"], proportion=1.0, argmax=True)
    assert torch.equal(arg[mask], logits.argmax(-1)[mask]) and torch.equal(arg[~mask], y[~mask])
    half, _ = sundae_step(
        model, y, mask, enc, b["attention_mask"], proportion=0.5, argmax=True, generator=g
    )
    assert ((half == y) | (half == arg)).all()


def _overfit(objective: str, steps: int = 600):
    """tiny-bert converted and trained on two pairs until it has learned them."""
    from gencraft.nar.config import ObjectiveConfig
    from gencraft.nar.functional import make_loss

    torch.manual_seed(0)
    model, tok = load_mlm_seq2seq("tiny-bert", seed=0, max_target_length=16)
    pairs = [("red", "apple pie"), ("blue", "sky")]
    b = _batch(tok, pairs)
    loss_fn = make_loss(ObjectiveConfig(objective=objective, label_smoothing=0.0), tok)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        loss, _ = loss_fn(model, b)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), tok, b, pairs


def test_a_tiny_sundae_model_learns_two_pairs_and_its_samplers_recover_them():
    model, tok, b, pairs = _overfit("sundae")
    cfg = SamplingConfig(steps=10, samples=4, temperature=0.1, length_candidates=1, seed=0)
    out = sundae_generate(model, b["input_ids"], b["attention_mask"], cfg, noise=noise_ids(tok))
    assert [tok.decode(s) for s in out.sequences] == [t for _, t in pairs]
    assert all(1 <= c <= cfg.steps + 1 for c in out.model_calls)
    argmax = SamplingConfig(steps=10, samples=2, length_candidates=1, argmax_unrolled=True)
    out = sundae_generate(model, b["input_ids"], b["attention_mask"], argmax, noise=noise_ids(tok))
    assert [tok.decode(s) for s in out.sequences] == [t for _, t in pairs]


def test_a_tiny_mask_predict_model_learns_two_pairs():
    model, tok, b, pairs = _overfit("mask-predict")
    cfg = SamplingConfig(steps=4, length_candidates=1)
    out = mask_predict_generate(
        model, b["input_ids"], b["attention_mask"], cfg, mask_id=tok.mask_token_id
    )
    assert [tok.decode(s) for s in out.sequences] == [t for _, t in pairs]
    # T = 4: re-mask ⌊L·(T−t)/T⌋ = 2, 1, 0 (stop) of "sky", 6, 4, 2 of "apple pie"
    assert out.model_calls == [4, 3]
    # oracle lengths take the place of the predicted ones
    fixed = mask_predict_generate(
        model,
        b["input_ids"],
        b["attention_mask"],
        cfg,
        mask_id=tok.mask_token_id,
        lengths=b["lengths"],
    )
    assert [len(s) for s in fixed.sequences] == b["lengths"].tolist()


# ------------------------------------------------------------------ bad input
def test_bad_input_is_named(tiny):
    from gencraft.models.tiny import build_tiny_model

    model, tok = tiny
    with pytest.raises(GencraftError, match="cannot use 'no-such-mlm' as a masked LM"):
        mlm_to_seq2seq("no-such-mlm")
    with pytest.raises(GencraftError, match="masked-lm"):
        mlm_to_seq2seq("tiny-gpt2")
    with pytest.raises(GencraftError, match=r"GPT2LMHeadModel \(gpt2\) is not supported by mlm"):
        mlm_to_seq2seq(build_tiny_model("tiny-gpt2"))
    for kw, what in (
        ({"steps": 0}, "steps must be >= 1"),
        ({"temperature": 0.0}, "temperature must be > 0"),
        ({"proportion": 0.0}, "proportion must lie in \\(0, 1\\]"),
        ({"proportion": 1.5}, "proportion must lie in \\(0, 1\\]"),
    ):
        with pytest.raises(GencraftError, match=what):
            SamplingConfig(**kw)
    b = _batch(tok, [("x", "ab")])
    noise = noise_ids(tok)
    for bad in (0, 25, 600):
        with pytest.raises(GencraftError, match=f"target length {bad} is outside \\[1, 24\\]"):
            sundae_generate(model, b["input_ids"], None, noise=noise, lengths=torch.tensor([bad]))
    long = collate([(tok("x").input_ids, list(range(5, 35)))], tok.pad_token_id)
    with pytest.raises(GencraftError, match="exceeds the model's max_target_length=24"):
        sundae_loss(model, long, noise=noise)
    with pytest.raises(GencraftError, match=r"bidirectional \(non-autoregressive\): decode with"):
        model.generate(input_ids=b["input_ids"], max_new_tokens=2)
    causal = mlm_to_seq2seq("tiny-bert", bidirectional=False)
    with pytest.raises(
        GencraftError, match="needs a bidirectional decoder; this model's is causal"
    ):
        mask_predict_generate(causal, b["input_ids"], mask_id=tok.mask_token_id)
    with pytest.raises(GencraftError, match="autoregressive decoding needs a model converted"):
        autoregressive_generate(model, b["input_ids"])
    with pytest.raises(GencraftError, match="max_target_length must be >= 1"):
        mlm_to_seq2seq("tiny-bert", max_target_length=0)


def test_cli_train_resume_generate_eval_and_errors(shared_data, tmp_path, capsys):
    out, data = tmp_path / "run", ["--data-dir", str(shared_data)]
    train = ["nar", "train", "--model", "tiny-bert", "--max-steps", "2", "--batch-size", "4"]
    train += ["--train-examples", "16", "--valid-examples", "4", "--max-target-length", "200"]
    train += ["--output", str(out), "--quiet", *data]
    assert main(train) == 0
    assert (out / "best" / "run_settings.json").is_file()
    assert main(train) == 0  # a finished run resumes and stops at once
    assert '"steps": 2' in capsys.readouterr().out
    generate = ["nar", "generate", str(out / "best")]
    assert main([*generate, "--sources", "name : A", "--samples", "2", "--json"]) == 0
    assert '"model_calls"' in capsys.readouterr().out
    for method in ("sundae", "mask-predict"):  # τ = 0 decides every position in one call
        args = [*generate, "--sources", "name : A", "b c"]
        assert main([*args, "--method", method, "--threshold", "0", "--json"]) == 0
        assert [r["model_calls"] for r in json.loads(capsys.readouterr().out)] == [1, 1]
    assert main([*args, "--threshold", "1.5"]) == 2
    assert "gencraft: error: threshold must lie in [0, 1]" in capsys.readouterr().err
    assert main([*args, "--threshold", "0.5", "--proportion", "0.5"]) == 2
    assert "proportion does not apply with threshold" in capsys.readouterr().err
    evaluate = ["nar", "eval", str(out / "best"), "--limit", "2", "--samples", "2"]
    evaluate += ["--steps", "2"]
    assert main([*evaluate, "--quiet", "--lowercase", *data]) == 0
    shown = capsys.readouterr().out
    assert "BLEU" in shown and "scored by score_task: E2E challenge convention" in shown
    assert "lower-cased (asked for by the caller)" in shown  # --lowercase says so
    assert main([*generate, "--sources", "x", "--temperature", "0"]) == 2
    assert "gencraft: error: temperature must be > 0" in capsys.readouterr().err
    bad = ["nar", "train", "--model", "tiny-bert", "--objective", "autoregressive"]
    assert main([*bad, "--output", str(tmp_path / "x")]) == 2
    assert "needs --no-bidirectional" in capsys.readouterr().err


def test_nar_experiment_runs_at_tiny_scale(shared_data, tmp_path, monkeypatch):
    from gencraft.studies import nar as experiments
    from gencraft.studies.runner import reproduce

    # The real tuning runs; its pick is then made distinct per model, so that a decode at
    # another model's temperature shows in the report (tiny models often tie on the pick).
    real_tune, forced = experiments._tune, {"rum-sundae": 0.5, "sundae-scratch": 1.0}

    def tune(s, out, sampling):
        return {**real_tune(s, out, sampling), "temperature": forced[out.name]}

    monkeypatch.setattr(experiments, "_tune", tune)
    report = reproduce(
        "nar-tasks",
        scale="tiny",
        output=tmp_path,
        overrides={
            "data_dir": str(shared_data),
            "variants": ("rum-sundae", "sundae-scratch", "autoregressive"),
        },
    )
    text = report.read_text()
    units = json.loads((tmp_path / "results.json").read_text())["units"]
    for name, t in forced.items():  # each SUNDAE model decodes at its own temperature
        assert units[f"tune {name}"]["temperature"] == t
        assert set(units[f"tune {name}"]["validation bleu"]) == {"0.5", "1.0"}  # tiny grid
        assert f"sundae (T={t})" in text.split(f"| {name} | ")[1].split("\n")[0]
    assert "| rum-sundae | MLM |" in text and "| autoregressive | MLM |" in text
    # the curve: fixed steps and a confidence threshold, each point a unit with its calls
    for key in ("curve rum-sundae 1", "curve rum-sundae tau=0.5"):
        assert units[key]["calls/output"] >= 1
    assert units["curve rum-sundae tau=0.5"]["calls/output"] <= 8  # threshold_steps caps it
    assert (tmp_path / "quality_vs_steps.png").is_file()
    assert "| model | fixed steps | BLEU | calls/output | threshold reaching it |" in text
    assert math.isfinite(float(text.split("| rum-sundae | MLM | 3 |")[1].split("|")[3]))


def test_autoregressive_decoding_at_one_beam_and_a_fixed_length():
    """num_beams=1 (greedy) works and scores its output by the summed log-probabilities of its
    tokens before the processors, as beam search does (``generate`` gives no sequences_scores
    there); min_new_tokens fixes the length (EOS held off)."""
    model, tok = load_mlm_seq2seq("tiny-bert", seed=0, max_target_length=16, bidirectional=False)
    b = _batch(tok, [("x y", "ab")])
    kw = dict(max_new_tokens=6, min_new_tokens=6)
    greedy = autoregressive_generate(model, b["input_ids"], num_beams=1, **kw)
    assert greedy.steps == [6]
    ids = torch.tensor([[model.generation_config.decoder_start_token_id, *greedy.sequences[0]]])
    with torch.no_grad():
        enc = model.get_encoder()(input_ids=b["input_ids"]).last_hidden_state
        logits = model(encoder_outputs=(enc,), decoder_input_ids=ids).logits[0, :-1]
    want = logits.log_softmax(-1).gather(1, ids[0, 1:, None]).sum()
    assert greedy.scores[0] == pytest.approx(float(want), abs=1e-4)


# ----------------------------------------------------------------------------
def test_mask_predict_remasks_the_least_confident_tokens():
    from gencraft.nar.decoding import least_confident

    logp = torch.tensor([[-0.1, -2.0, -0.5, -3.0, -0.2], [-1.0, -0.1, -4.0, 0.0, 0.0]])
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    got = least_confident(logp, mask, torch.tensor([2, 1]))
    want = torch.tensor([[False, True, False, True, False], [False, False, True, False, False]])
    assert torch.equal(got, want)  # padding (logp 0) is never re-masked


def test_sundae_rerank_keeps_the_highest_scoring_sample():
    from gencraft.nar.decoding import rerank

    token_logp = torch.tensor([[-1.0, -1.0, 0.0], [-0.2, -0.4, -0.3], [-3.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, True, True], [True, False, False]])
    len_logp = torch.tensor([-0.1, -2.0, -0.5])
    # sums -2.0, -0.9, -3.0; means -1.0, -0.3, -3.0; means + length -1.1, -2.3, -3.5
    for how, best, scores in (
        ("sum-logprob", 1, [-2.0, -0.9, -3.0]),
        ("mean-logprob", 1, [-1.0, -0.3, -3.0]),
        ("mean-logprob+length", 0, [-1.1, -2.3, -3.5]),
    ):
        i, s = rerank(token_logp, mask, len_logp, how)
        assert i == best, how
        torch.testing.assert_close(s, torch.tensor(scores))


# ------------------------------------------------------------------ guarded rules
def test_the_length_predictor_pools_only_real_source_positions(tiny):
    """Padding (whatever its states) does not change the predicted lengths."""
    model, _ = tiny
    model.eval()
    torch.manual_seed(0)
    hidden = torch.randn(1, 5, model.config.encoder.hidden_size)
    padded = torch.cat([hidden, 100 * torch.randn(1, 3, hidden.shape[-1])], 1)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0, 0]])
    with torch.no_grad():
        torch.testing.assert_close(
            model.length_logits(padded, mask), model.length_logits(hidden, torch.ones(1, 5))
        )


def test_mask_predict_ranks_length_candidates_by_mean_log_probability(tiny):
    """One iteration over candidate lengths 2 and 9: the score of each is the mean of its
    tokens' log-probabilities (a sum would favour the short one), and the best mean wins."""
    model, tok = tiny
    model.eval()
    ids = tok(["name : Aromi | area : riverside"], return_tensors="pt")
    mask_id = tok.mask_token_id
    cfg = SamplingConfig(steps=1)
    enc = model.encode(ids.input_ids, ids.attention_mask).last_hidden_state
    means = {}
    for n in (2, 9):
        with torch.no_grad():
            logits = model.decode_logits(
                torch.full((1, n), mask_id), enc, ids.attention_mask, torch.ones(1, n).long()
            )
        means[n] = float(torch.log_softmax(logits.float(), -1).max(-1).values.mean())
    out = mask_predict_generate(
        model, ids.input_ids, ids.attention_mask, cfg, mask_id=mask_id, lengths=[[2, 9]]
    )
    best = max(means, key=means.get)
    assert len(out.sequences[0]) == best
    assert out.scores[0] == pytest.approx(means[best], abs=1e-5)


def test_the_autoregressive_baseline_ends_after_the_last_word(monkeypatch):
    """Teacher forcing: labels are y followed by [SEP] at position len(y), never [SEP] over
    y's last word."""
    import gencraft.nar.functional as nf

    model, tok = load_mlm_seq2seq("tiny-bert", seed=0, max_target_length=16, bidirectional=False)
    seen = {}
    real = nf._token_ce

    def spy(logits, targets, where, smoothing):
        seen["labels"], seen["where"] = targets.clone(), where.clone()
        return real(logits, targets, where, smoothing)

    monkeypatch.setattr(nf, "_token_ce", spy)
    batch = _batch(tok, [("a b", "x y z"), ("c", "w")])
    end = tok.sep_token_id
    nf.autoregressive_loss(model, batch, start_id=tok.cls_token_id, end_id=end)
    for row, n in enumerate(batch["lengths"].tolist()):
        labels = seen["labels"][row]
        assert labels[:n].tolist() == batch["targets"][row, :n].tolist()
        assert int(labels[n]) == end and bool(seen["where"][row, n])
        assert not seen["where"][row, n + 1 :].any()


def test_a_test_unit_saved_under_older_column_names_is_read_under_todays():
    """Results saved by an older version named the earlier scoring's columns otherwise; the
    report reads them under today's names, and today's stay as they are."""
    from gencraft.studies.nar import _RESCORED, _rescored

    older = {"BLEU (lower-cased)": 1.0, "ROUGE-L (lower-cased)": 2.0}
    older |= {"BLEU (before the change)": 3.0, "ROUGE-L (before the change)": 4.0}
    assert _rescored(older) == dict(zip(_RESCORED, (1.0, 2.0, 3.0, 4.0), strict=True))
    today = dict(zip(_RESCORED, (5.0, 6.0, 7.0, 8.0), strict=True))
    assert _rescored(today) == today
