"""PointerSentinelLSTM, its regularisers, the truncated-BPTT schedule and the trainer."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from gencraft.data import load_lm_corpus
from gencraft.errors import GencraftError
from gencraft.pointer import (
    LockedDropout,
    PointerSentinelConfig,
    PointerSentinelLSTM,
    PointerTrainer,
    TrainConfig,
    ZoneoutLSTM,
    evaluate,
    pointer_sentinel_log_probs,
    tbptt_schedule,
)
from gencraft.training import Validated


@pytest.fixture(scope="module")
def corpus(synthetic_lm_dir):
    return load_lm_corpus("ptb", synthetic_lm_dir)


def tiny(vocab: int, **kw) -> PointerSentinelLSTM:
    torch.manual_seed(0)
    return PointerSentinelLSTM.from_preset("tiny", vocab, **kw)


# -- regularisers ----------------------------------------------------------------------------
def test_locked_dropout_mask_is_fixed_across_time_and_identity_at_eval():
    torch.manual_seed(0)
    d = LockedDropout(0.5).train()
    y = d(torch.ones(4, 9, 16))
    assert torch.equal(y, y[:, :1].expand_as(y))  # the same mask at every step
    assert set(y.unique().tolist()) == {0.0, 2.0}  # inverted-dropout scaling 1 / (1 - p)
    d.eval()
    x = torch.randn(4, 9, 16)
    assert torch.equal(d(x), x)


def _run(m: ZoneoutLSTM, x: torch.Tensor) -> torch.Tensor:
    return m(x)[0]


def test_zoneout_locked_mask_freezes_the_same_units_at_every_step():
    torch.manual_seed(0)
    m = ZoneoutLSTM(3, 16, 1, zoneout_c=0.5, zoneout_h=0.5, zoneout_mask="locked").train()
    h = _run(m, torch.randn(2, 12, 3))
    frozen = (h == 0).all(dim=1)  # units that kept the zero initial state throughout
    assert frozen.any() and (~frozen).any()
    assert torch.equal(h == 0, frozen.unsqueeze(1).expand_as(h))  # same units at all t


def test_zoneout_per_step_mask_changes_across_steps():
    torch.manual_seed(0)
    m = ZoneoutLSTM(3, 64, 1, zoneout_h=0.5).train()
    h = _run(m, torch.randn(2, 12, 3))
    kept = h[:, 1:] == h[:, :-1]  # unit kept its previous value at this step
    assert 0.3 < kept.float().mean() < 0.7
    assert not torch.equal(kept[:, 0], kept[:, 1])


def test_zoneout_eval_is_deterministic_and_none_mode_is_the_plain_lstm():
    torch.manual_seed(0)
    x = torch.randn(2, 7, 3)
    m = ZoneoutLSTM(3, 8, 2, dropout=0.3, zoneout_c=0.4, zoneout_h=0.2).eval()
    assert torch.equal(_run(m, x), _run(m, x))
    lstm = torch.nn.LSTM(3, 8, 2, batch_first=True)
    for i, layer in enumerate(m.layers):
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(lstm, f"{name}_l{i}").data.copy_(getattr(layer, f"{name}_l0"))
    m.zoneout_eval = "none"
    torch.testing.assert_close(_run(m, x), lstm(x)[0])
    m.zoneout_eval = "expectation"
    assert not torch.allclose(_run(m, x), lstm(x)[0])


def test_zoneout_eval_is_the_expectation_of_the_training_masks():
    """One step from a fixed state is linear in the zoneout masks, so the eval output (default
    ``zoneout_eval``) must equal the mean over many training draws; ``"none"`` (the plain
    update) is off by zoneout_h * (h0 - h_new). Over several steps: the blend by hand."""
    torch.manual_seed(0)
    m = ZoneoutLSTM(3, 8, 1, zoneout_c=0.3, zoneout_h=0.6)
    n = 20000
    x = torch.randn(1, 1, 3)
    h0, c0 = torch.randn(1, 1, 8), torch.randn(1, 1, 8)
    state = (h0.expand(1, n, 8), c0.expand(1, n, 8))
    with torch.no_grad():
        mean = m.train()(x.expand(n, 1, 3), state)[0].mean(0)  # [1, 8]
        want = m.eval()(x, (h0, c0))[0][0]
    assert (mean - want).abs().max() < 0.04
    # several steps, by hand: c = zc c + (1 - zc) c_new, h = zh h + (1 - zh) h_new
    xs = torch.randn(2, 5, 3)
    layer = m.layers[0]
    cell = torch.nn.LSTMCell(3, 8)
    for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
        getattr(cell, name).data.copy_(getattr(layer, f"{name}_l0"))
    h, c = torch.zeros(2, 8), torch.zeros(2, 8)
    outs = []
    with torch.no_grad():
        for t in range(5):
            h_new, c_new = cell(xs[:, t], (h, c))
            c = 0.3 * c + 0.7 * c_new
            h = 0.6 * h + 0.4 * h_new
            outs.append(h)
        torch.testing.assert_close(m(xs)[0], torch.stack(outs, 1), atol=1e-5, rtol=1e-5)


def test_step_loop_equals_fused_kernel_and_keeps_intermediate_state():
    torch.manual_seed(0)
    m = ZoneoutLSTM(3, 8, 2).eval()
    x = torch.randn(2, 9, 3)
    fused, fstate, fkept = m(x, keep_state_at=4)
    m.zoneout_c = 1e-30  # activates the loop; keeping with probability ~0 changes nothing
    loop, lstate, lkept = m(x, keep_state_at=4)
    torch.testing.assert_close(loop, fused)
    torch.testing.assert_close(lstate, fstate)
    torch.testing.assert_close(lkept, fkept)
    torch.testing.assert_close(m(x[:, 4:], lkept)[0], fused[:, 4:])


# -- the model ---------------------------------------------------------------------------------
@pytest.mark.parametrize("h", [32, 65])
def test_pointer_adds_exactly_h2_plus_2h_parameters(h):
    c = dict(vocab_size=50, hidden_size=h, embedding_size=20, window=10)
    with_ptr = PointerSentinelLSTM(PointerSentinelConfig(**c))
    plain = PointerSentinelLSTM(PointerSentinelConfig(**c, pointer=False))
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert n(with_ptr) - n(plain) == h * h + 2 * h == with_ptr.num_pointer_parameters()


def test_medium_preset_matches_the_paper_size():
    m = PointerSentinelLSTM.from_preset("medium", 10_000)
    n = sum(p.numel() for p in m.parameters())
    assert m.num_pointer_parameters() == 650**2 + 2 * 650
    # Table 2: LSTM 20M, pointer model 21M (untied, 10k-word PTB vocabulary); we count 20.2M
    assert 20.0e6 < n < 21.1e6


def test_forced_gate_reduces_exactly_to_the_plain_lstm():
    m = tiny(40).eval()
    plain = PointerSentinelLSTM(PointerSentinelConfig(**{**m.config.to_dict(), "pointer": False}))
    plain.load_state_dict(m.state_dict(), strict=False)
    plain.eval()
    x = torch.randint(0, 40, (3, 15))
    y = torch.randint(0, 40, (3, 15))
    forced = m(x, y, force_gate=True).nll
    assert torch.equal(forced, plain(x, y).nll)
    assert not torch.allclose(m(x, y).nll, forced)


def test_gradients_reach_query_sentinel_lstm_and_embedding():
    m = tiny(40).train()
    x, y = torch.randint(0, 40, (2, 12)), torch.randint(0, 40, (2, 12))
    m(x, y).nll.mean().backward()
    for name in (
        "query.weight",
        "query.bias",
        "sentinel",
        "rnn.layers.0.weight_hh_l0",
        "rnn.layers.1.weight_ih_l0",
        "embedding.weight",
        "decoder.weight",
    ):
        g = dict(m.named_parameters())[name].grad
        assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0, name
    m.zero_grad(set_to_none=True)
    m(x, y, force_gate=True).nll.mean().backward()
    assert m.query.weight.grad is None and m.sentinel.grad is None


def test_sequence_mixture_equals_the_functional_core_per_position():
    """The banded, whole-sequence computation equals eqs. 5-8 applied window by window."""
    m = tiny(40, window=5).eval()
    x = torch.randint(0, 6, (2, 11))  # few distinct words: many repeats in each window
    y = torch.randint(0, 8, (2, 11))
    mem = torch.randn(2, 3, 32).tanh()
    mem_ids = torch.randint(0, 6, (2, 3))
    mem_mask = torch.tensor([[True, True, True], [False, False, True]])
    out = m(
        x,
        y,
        memory=mem,
        memory_ids=mem_ids,
        memory_mask=mem_mask,
        return_attention=True,
        return_logits=True,
    )
    states = torch.cat([mem, out.outputs], 1)
    ids = torch.cat([mem_ids, x], 1)
    valid = torch.cat([mem_mask, torch.ones_like(x, dtype=torch.bool)], 1)
    full = m.full_log_probs(out.logits, out.log_attn, out.gate, ids)
    torch.testing.assert_close(full.exp().sum(-1), torch.ones(2, 11))
    for t in range(11):
        j = 3 + t
        lo = max(0, j - 4)
        q = torch.tanh(m.query(out.outputs[:, t]))
        ref, gate = pointer_sentinel_log_probs(
            out.logits[:, t],
            q,
            states[:, lo : j + 1],
            ids[:, lo : j + 1],
            m.sentinel,
            valid[:, lo : j + 1],
        )
        torch.testing.assert_close(full[:, t], ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out.gate[:, t], gate)
        torch.testing.assert_close(-out.nll[:, t], ref.gather(1, y[:, t : t + 1]).squeeze(1))


def test_eval_perplexity_does_not_depend_on_chunk_size(corpus):
    m = tiny(len(corpus.vocab))
    ids = corpus["valid"]
    a = evaluate(m, ids, batch_size=2, bptt=7)
    b = evaluate(m, ids, batch_size=2, bptt=64)
    assert a["tokens"] == b["tokens"] == (ids.numel() // 2 - 1) * 2
    assert math.isclose(a["nll"], b["nll"], rel_tol=1e-5)


def test_bad_input_gives_clear_errors(corpus):
    with pytest.raises(ValueError, match="window must be at least 1"):
        PointerSentinelConfig(vocab_size=10, window=0)
    m = tiny(len(corpus.vocab) + 1)
    with pytest.raises(GencraftError, match="vocabulary mismatch"):
        PointerTrainer(m, corpus, TrainConfig(), "unused", progress=False)
    with pytest.raises(ValueError, match="input_ids must lie"):
        m(torch.tensor([[0, 10_000]]))
    with pytest.raises(ValueError, match="targets must be"):
        m(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="k1 must lie"):
        TrainConfig(bptt=10, k1=11)
    with pytest.raises(GencraftError, match="unknown preset"):
        PointerSentinelLSTM.from_preset("huge", 10)


# -- truncated BPTT ----------------------------------------------------------------------------
@pytest.mark.parametrize(("k1", "k2", "prefix"), [(10, 10, 0), (10, 10, 7), (1, 8, 0), (3, 8, 4)])
def test_tbptt_schedule_covers_each_target_once_and_carries_consistently(k1, k2, prefix):
    n = 47
    steps = list(tbptt_schedule(n, k1, k2, prefix))
    scored = [p for s in steps for p in range(s.loss_start, s.end)]
    assert scored == list(range(n))
    for s, nxt in itertools.pairwise(steps):
        assert s.start + s.keep == nxt.start  # the carried state is where the next step starts
        assert 0 <= s.keep <= s.end - s.start
    for s in steps:
        assert s.end - s.grad_start <= k2 and s.end - s.loss_start <= k1
        assert s.start == min(s.grad_start, max(0, s.loss_start - prefix))  # window reachable


@pytest.mark.parametrize(
    "opts", [dict(), dict(k1=1), dict(k1=3), dict(window_refresh="stale")], ids=str
)
def test_training_steps_score_exactly_what_full_evaluation_scores(corpus, opts):
    """With lr = 0 and no dropout the schedule, carried state and window must reproduce a plain
    pass over the streams, whatever k1, k2 and the window refresh policy."""
    m = tiny(len(corpus.vocab), dropout=0.0, output_dropout=0.0, zoneout_c=0.0, zoneout_h=0.0)
    cfg = TrainConfig(batch_size=4, bptt=6, lr=0.0, **opts)
    tr = PointerTrainer(m, corpus, cfg, "unused", progress=False)
    got = []
    for st in tr.steps()[:15]:
        tr.train_step(st)
        got.append(tr.last_nll)
    got = torch.cat(got, 1)
    ref = evaluate(m, corpus["train"], batch_size=4, bptt=50, return_details=True)["token_nll"]
    torch.testing.assert_close(got, ref[:, : got.shape[1]], atol=1e-5, rtol=1e-5)


def test_regenerated_window_uses_current_parameters_and_the_step_masks(corpus):
    """k1 = k2 with lr > 0: each step's pointer window is re-run with the parameters of that
    step and the dropout masks of its trained span (shared, not fresh), so it differs from the
    previous step's (stale) outputs; window_refresh="stale" reuses those and fails here."""
    import copy

    m = tiny(len(corpus.vocab), zoneout_c=0.0, zoneout_h=0.0, dropout=0.3, output_dropout=0.3)
    tr = PointerTrainer(
        m,
        corpus,
        TrainConfig(batch_size=4, bptt=6, lr=0.05, optimizer="adam"),
        "unused",
        progress=False,
    )
    seen = {}
    m.register_forward_pre_hook(
        lambda mod, args, kw: seen.update(memory=kw["memory"], masks=kw["masks"]), with_kwargs=True
    )
    steps = tr.steps()
    checked = 0
    previous = None
    for st in steps[:4]:
        before, carry = copy.deepcopy(m), tr.carry
        tr.train_step(st)
        if st.grad_start > st.start and previous is not None:
            window = tr.streams[:, st.start : st.grad_start]
            p_model, p_carry, p_masks, p_st = previous
            with torch.no_grad():
                before.train()
                regen = before.encode(window, carry, masks=seen["masks"])[0]
                fresh = before.encode(window, carry, masks=before.sample_masks(4, window.device))
                # the previous step's outputs at these positions (its parameters and masks)
                stale = p_model.train().encode(
                    tr.streams[:, p_st.start : p_st.end], p_carry, masks=p_masks
                )[0][:, st.start - p_st.start : st.grad_start - p_st.start]
            torch.testing.assert_close(seen["memory"], regen)  # current parameters, step masks
            assert not torch.allclose(seen["memory"], fresh[0], atol=1e-4)  # the masks matter
            assert not torch.allclose(seen["memory"], stale, atol=1e-4)  # parameters changed
            checked += 1
        previous = (before, carry, seen["masks"], st)
    assert checked >= 2


# -- persistence and resumption -----------------------------------------------------------------
def test_train_save_load_gives_identical_eval_perplexity(corpus, tmp_path):
    m = tiny(len(corpus.vocab))
    tr = PointerTrainer(
        m, corpus, TrainConfig(batch_size=4, bptt=10, lr=1.0, max_steps=5), tmp_path, progress=False
    )
    tr.train()
    m.save_pretrained(tmp_path / "saved")
    again = PointerSentinelLSTM.from_pretrained(tmp_path / "saved")
    a = evaluate(m, corpus["test"], batch_size=2, bptt=20)
    b = evaluate(again, corpus["test"], batch_size=2, bptt=20)
    assert a["ppl"] == b["ppl"]


def test_a_pointer_run_has_the_one_run_format(corpus, tmp_path):
    """best/, last/, history.json and train_summary.json, as every fit-based trainer writes;
    a resumed run's wall_seconds counts the earlier invocation too."""
    import json

    from gencraft.training import load_run

    cfg = TrainConfig(batch_size=4, bptt=10, lr=1.0, max_steps=3, eval_every=2)
    PointerTrainer(tiny(len(corpus.vocab)), corpus, cfg, tmp_path, progress=False).train()
    first = json.loads((tmp_path / "train_summary.json").read_text())
    assert first["steps"] == 3 and first["stopped"] == "max_steps"
    assert first["best_valid_loss"] == pytest.approx(
        math.log(min(r["valid_ppl"] for r in first["history"]))
    )
    assert load_run(tmp_path, which="last").model.config.vocab_size == len(corpus.vocab)
    assert (tmp_path / "best").is_dir() and (tmp_path / "history.json").is_file()
    cfg = TrainConfig(batch_size=4, bptt=10, lr=1.0, max_steps=4, eval_every=2)
    PointerTrainer(tiny(len(corpus.vocab)), corpus, cfg, tmp_path, progress=False).train()
    second = json.loads((tmp_path / "train_summary.json").read_text())
    assert second["steps"] == 4 and second["wall_seconds"] > first["wall_seconds"]


def test_resumed_training_equals_uninterrupted_training(corpus, tmp_path):
    cfg = dict(batch_size=4, bptt=10, lr=0.5, optimizer="adam", eval_every=4, seed=3)

    def run(out, max_steps):
        torch.manual_seed(123)  # a different ambient seed must not matter after resuming
        m = tiny(len(corpus.vocab))
        PointerTrainer(
            m, corpus, TrainConfig(max_steps=max_steps, save_every=1, **cfg), out, progress=False
        ).train()
        return m

    straight = run(tmp_path / "a", 9)
    run(tmp_path / "b", 5)
    resumed = run(tmp_path / "b", 9)
    for (k, v), (_, w) in zip(
        straight.state_dict().items(), resumed.state_dict().items(), strict=True
    ):
        assert torch.equal(v, w), k


def test_lr_halves_when_validation_gets_worse_and_training_stops(corpus, tmp_path):
    m = tiny(len(corpus.vocab))
    cfg = TrainConfig(
        batch_size=4, bptt=10, lr=50.0, clip=5.0, eval_every=2, max_steps=40, patience=2
    )
    hist = PointerTrainer(m, corpus, cfg, tmp_path, progress=False).train()
    ppls = [h["valid_ppl"] for h in hist]
    halvings = 0
    for i in range(1, len(hist) - 1):  # a row's lr is the one that led to its evaluation
        worse = ppls[i] > ppls[i - 1]
        halvings += worse
        assert hist[i + 1]["lr"] == (hist[i]["lr"] / 2 if worse else hist[i]["lr"])
    assert halvings >= 1
    best = min(range(len(ppls)), key=ppls.__getitem__)
    if hist[-1]["step"] < 40:  # stopped early: `patience` evaluations without a new best
        assert len(ppls) - 1 - best == 2
    assert (tmp_path / "best" / "method_model.safetensors").is_file()


def test_revert_on_worse_restores_the_best_weights(corpus, tmp_path):
    m = tiny(len(corpus.vocab))
    cfg = TrainConfig(
        batch_size=4,
        bptt=10,
        lr=1e-2,
        optimizer="adam",
        max_steps=2,
        eval_every=2,
        revert_on_worse=True,
    )
    tr = PointerTrainer(m, corpus, cfg, tmp_path, progress=False)
    tr.train()
    best = PointerSentinelLSTM.from_pretrained(tmp_path / "best").state_dict()
    with torch.no_grad():  # a diverged update
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 3)
    assert tr.optimizer.state  # Adam's moments
    # fit's call after a validation worse than the last one (best/ is not rewritten)
    event = Validated(m, tr.optimizer, float("inf"), False, {"train_time": 1.0})
    assert tr.after_validation(event) is False
    assert event.row["reverted_to_best"] and event.row["lr"] == 1e-2 and tr.lr == 5e-3
    for k, v in m.state_dict().items():
        assert torch.equal(v, best[k]), k
    assert not tr.optimizer.state  # fresh Adam moments
    assert tr.carry is None and tr.memory is None


def test_the_plateau_rule_stops_the_run_and_a_rerun_says_so(corpus, tmp_path, capsys):
    """patience = 1: the run stops at its first validation without a new best (``early_stop``,
    before the step budget), and a re-run resumes only to say it has finished."""
    import json

    cfg = TrainConfig(batch_size=4, bptt=10, lr=50.0, clip=5.0, eval_every=1, max_steps=200)
    cfg.patience = 1
    hist = PointerTrainer(tiny(len(corpus.vocab)), corpus, cfg, tmp_path, progress=False).train()
    ppls = [h["valid_ppl"] for h in hist]
    summary = json.loads((tmp_path / "train_summary.json").read_text())
    assert summary["stopped"] == "early_stop" and summary["steps"] == len(ppls) < 200
    assert all(ppls[i] < min(ppls[:i]) for i in range(1, len(ppls) - 1))  # new bests until
    assert ppls[-1] >= min(ppls[:-1])  # the first validation without one
    capsys.readouterr()
    again = PointerTrainer(tiny(len(corpus.vocab)), corpus, cfg, tmp_path, progress=False)
    assert again.train() == hist
    assert "already finished (early_stop" in capsys.readouterr().out


@pytest.mark.parametrize(("lr", "step_5_better"), [(5.0, True), (20.0, False)])
def test_an_extended_run_ends_with_the_straight_runs_weights_and_keeps_its_own_validation(
    corpus, tmp_path, lr, step_5_better
):
    """Default settings but the learning rate: a run trained to 5 steps and extended to 9 ends
    with the weights of a run straight to 9 (last/), but it validated at step 5 too, where its
    first invocation ended: its best/ is the better of steps 5 and 9, which a straight run
    never compares."""
    from safetensors.torch import load_file

    def run(out, max_steps):
        m = tiny(len(corpus.vocab))
        cfg = TrainConfig(max_steps=max_steps, batch_size=4, bptt=10, seed=3, lr=lr)
        return PointerTrainer(m, corpus, cfg, out, progress=False).train()

    def weights(out, which):
        return load_file(str(out / which / "method_model.safetensors"))

    straight = run(tmp_path / "a", 9)
    first = run(tmp_path / "b", 5)
    extended = run(tmp_path / "b", 9)
    assert [h["step"] for h in straight] == [9] and [h["step"] for h in extended] == [5, 9]
    assert extended[0]["valid_loss"] == first[0]["valid_loss"]
    assert extended[1]["valid_loss"] == straight[0]["valid_loss"]
    for k, v in weights(tmp_path / "a", "last").items():
        assert torch.equal(v, weights(tmp_path / "b", "last")[k]), k
    at_5 = extended[0]["valid_loss"] < extended[1]["valid_loss"]
    assert at_5 == step_5_better  # both cases are met
    want = weights(tmp_path / "a", "best") if not at_5 else None
    if at_5:  # the best model is step 5's: a third run stopped there has it
        run(tmp_path / "c", 5)
        want = weights(tmp_path / "c", "best")
    assert all(torch.equal(v, want[k]) for k, v in weights(tmp_path / "b", "best").items())
