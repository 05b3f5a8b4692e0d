"""The contract every gencraft method model keeps (peft's ``testing_common`` idea): a method
case says how to build the method on a tiny model, and :class:`MethodTests` runs the same
checks on each case:

* save -> load gives identical outputs, through the class and through ``load_method``;
* disabled, the model gives its base model's outputs exactly (and ``with disable()`` switches
  it back on); a model that wraps no base refuses, saying why;
* ``remove()`` gives back the untouched base: same outputs, same ``requires_grad`` flags, no
  hooks or plug-ins left;
* the same seed builds the same model, with the same outputs and gradients;
* gradients reach only the method's parameters;
* a bad setting raises :class:`~gencraft.errors.ConfigError`;
* a tiny :func:`~gencraft.training.fit` run interrupted by Ctrl-C resumes to the weights of an
  uninterrupted run;
* for methods that generate: gencraft's ``beam_search`` scores are the method's own
  log-probabilities, and ``exact_mode`` equals brute force.

A case subclass sets the hooks below; ``tests/test_methods.py`` lists the seven.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
from typing import Any

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from gencraft.errors import ConfigError, GencraftError
from gencraft.models.attention import plugins_of
from gencraft.models.method import load_method
from gencraft.search import beam_search, beam_search_batch, exact_mode, exact_mode_batch
from gencraft.training import FitConfig, Interrupted, fit

PROMPT = [1, 3, 4]


def small_llama(seed: int, vocab: int = 6, context: int = 64) -> LlamaForCausalLM:
    """A random Llama over ``vocab`` ids with peaky distributions (large init), EOS = 0, GQA."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=context,
        eos_token_id=0,
        bos_token_id=1,
        pad_token_id=0,
        initializer_range=0.5,
    )
    return LlamaForCausalLM(cfg).eval()


def small_fame(seed: int, vocab: int = 6) -> nn.Module:
    """FAME over :func:`small_llama` (F = {1}) with a random, peaky focus head: its output
    differs from the base's, so a search that loses the source state shows."""
    from gencraft.focus import FocusConfig, FocusForConditionalGeneration

    base = small_llama(seed, vocab=vocab)
    torch.manual_seed(seed)
    fame = FocusForConditionalGeneration(base, FocusConfig(), frequent_ids=torch.tensor([1]))
    with torch.no_grad():
        for p in fame.head.parameters():
            p.normal_(0, 1.0)
    return fame.eval()


class MethodCase:
    """How to build and drive one method (override in subclasses)."""

    name = "method"
    #: remove() gives a base back / disable() switches to the base / gencraft's searches apply
    wraps_base = True
    can_disable = True
    searchable = True

    def base(self, seed: int) -> nn.Module | None:
        """A fresh base model (None for a method that wraps none)."""
        return small_llama(seed, vocab=5)

    def wrap(self, base: nn.Module | None, seed: int) -> nn.Module:
        raise NotImplementedError

    def make(self, seed: int) -> tuple[nn.Module, nn.Module | None]:
        """(method model, its base) on a tiny model."""
        base = self.base(seed)
        torch.manual_seed(seed + 100)
        return self.wrap(base, seed), base

    def inputs(self, seed: int = 0) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        return torch.cat([torch.tensor([PROMPT]), torch.randint(1, 5, (1, 5), generator=g)], 1)

    def method_parameters(self, wrapped: nn.Module) -> list[nn.Parameter]:
        return [p for p in wrapped.parameters() if p.requires_grad]

    def loss(self, wrapped: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def outputs(self, wrapped: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        """What the method computes (next-token log-probabilities [B, T, V] for an LM)."""
        raise NotImplementedError

    def base_outputs(self, base: nn.Module | None, ids: torch.Tensor, wrapped: Any) -> torch.Tensor:
        """What the disabled method must give: the base model's own outputs."""
        with torch.no_grad():
            return torch.log_softmax(base(ids).logits.float(), -1)

    def bad_config(self) -> None:
        """Build the method with a bad setting (must raise ConfigError)."""
        raise NotImplementedError

    def search_model(self, wrapped: nn.Module) -> Any:
        """What gencraft's searches are given (the wrapped model by default)."""
        return wrapped


def _hooks(module: nn.Module) -> int:
    """gencraft's hooks and attention plug-ins on ``module`` (transformers adds its own)."""
    mine = 0
    for m in module.modules():
        hooks = [*m._forward_hooks.values(), *m._forward_pre_hooks.values()]
        mine += sum(getattr(h, "__module__", "").startswith("gencraft") for h in hooks)
        mine += len(plugins_of(m))
    return mine


class MethodTests:
    """Mix into a test class together with a :class:`MethodCase`."""

    case: MethodCase

    def test_save_load_gives_identical_outputs(self, tmp_path):
        wrapped, base = self.case.make(0)
        ids = self.case.inputs()
        before = self.case.outputs(wrapped.eval(), ids)
        wrapped.save_pretrained(tmp_path / "saved")
        assert (tmp_path / "saved" / "method_config.json").is_file()
        if self.case.wraps_base:
            wrapped.remove()  # one method per base
        again = type(wrapped).from_pretrained(tmp_path / "saved", base)
        assert torch.equal(before, self.case.outputs(again.eval(), ids))
        if self.case.wraps_base:
            again.remove()
        generic = load_method(tmp_path / "saved", base)
        assert type(generic) is type(wrapped)
        assert torch.equal(before, self.case.outputs(generic.eval(), ids))
        assert type(generic.method_config) is type(wrapped.method_config)

    def test_a_save_from_before_the_shared_format_still_loads(self, tmp_path):
        wrapped, base = self.case.make(0)
        legacy = type(wrapped).legacy_files
        if legacy is None:
            pytest.skip(f"{self.case.name} had no format of its own before")
        ids = self.case.inputs()
        before = self.case.outputs(wrapped.eval(), ids)
        d = tmp_path / "old"
        wrapped.save_pretrained(d)
        payload = json.loads((d / "method_config.json").read_text())
        for key in ("method", "class", "format"):
            payload.pop(key)
        if set(payload) <= {"config", "base_saved"}:  # these wrote their settings flat
            payload = payload["config"]
        (d / legacy[0]).write_text(json.dumps(payload))
        (d / "method_model.safetensors").rename(d / legacy[1])
        (d / "method_config.json").unlink()
        if self.case.wraps_base:
            wrapped.remove()
        again = load_method(d, base)
        assert type(again) is type(wrapped)
        assert torch.equal(before, self.case.outputs(again.eval(), ids))

    def test_disabled_gives_the_base_outputs(self):
        wrapped, _ = self.case.make(1)
        ids = self.case.inputs(1)
        if not self.case.can_disable:
            with pytest.raises(GencraftError):
                wrapped.disable()
            return
        on = self.case.outputs(wrapped, ids)
        with wrapped.disable():
            off = self.case.outputs(wrapped, ids)
        # a fresh copy of the base: a method may hook the base it wraps
        ref = self.case.base_outputs(self.case.base(1), ids, wrapped)
        torch.testing.assert_close(off, ref, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(on, ref, atol=1e-3)  # the method did something when on
        assert wrapped.enabled and torch.equal(self.case.outputs(wrapped, ids), on)
        wrapped.disable()
        assert not wrapped.enabled
        torch.testing.assert_close(self.case.outputs(wrapped, ids), off)
        wrapped.enable()
        assert torch.equal(self.case.outputs(wrapped, ids), on)

    def test_remove_gives_back_the_untouched_base(self):
        ids = self.case.inputs(2)
        wrapped, base = self.case.make(2)
        if not self.case.wraps_base:
            with pytest.raises(GencraftError):
                wrapped.remove()
            return
        fresh = self.case.base(2)
        flags = [p.requires_grad for p in fresh.parameters()]
        hooks = _hooks(fresh)
        self.case.outputs(wrapped, ids)  # the method has run on it
        got = wrapped.remove()
        assert got is base
        assert [p.requires_grad for p in got.parameters()] == flags
        assert _hooks(got) == hooks
        for a, b in zip(got.state_dict().values(), fresh.state_dict().values(), strict=True):
            assert torch.equal(a, b)
        with torch.no_grad():
            assert torch.equal(got(ids).logits, fresh(ids).logits)

    def test_the_same_seed_builds_the_same_model(self):
        ids = self.case.inputs(3)
        (a, _), (b, _) = self.case.make(3), self.case.make(3)
        assert torch.equal(self.case.outputs(a, ids), self.case.outputs(b, ids))
        for m in (a, b):
            m.train()
            torch.manual_seed(0)
            self.case.loss(m, ids).backward()
        ga = [p.grad for p in self.case.method_parameters(a)]
        gb = [p.grad for p in self.case.method_parameters(b)]
        assert ga and all(torch.equal(x, y) for x, y in zip(ga, gb, strict=True))

    def test_gradients_reach_only_the_method_parameters(self):
        wrapped, _ = self.case.make(4)
        mine = {id(p) for p in self.case.method_parameters(wrapped)}
        assert mine
        self.case.loss(wrapped.train(), self.case.inputs(4)).backward()
        for n, p in wrapped.named_parameters():
            if id(p) in mine:
                assert p.grad is not None and p.grad.abs().sum() > 0, n
            else:
                assert p.grad is None or not p.grad.any(), n

    def test_a_bad_setting_raises_config_error(self):
        with pytest.raises(ConfigError):
            self.case.bad_config()

    def _fit(self, tmp, stop_at: int | None = None) -> nn.Module:
        wrapped, _ = self.case.make(5)
        params = self.case.method_parameters(wrapped)
        batches = [self.case.inputs(10 + i) for i in range(6)]

        def on_step(step: int, batch: Any) -> None:
            if step == stop_at:
                os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, handled between steps

        fit(
            wrapped,
            torch.optim.AdamW(params, lr=1e-2),
            batches,
            loss_fn=lambda m, batch: self.case.loss(m, batch[0]),
            config=FitConfig(epochs=2, batch_size=1, eval_every=3),
            valid=batches[:2],
            collate_fn=lambda items: items,
            output_dir=tmp,
            progress=False,
            on_step=on_step,
        )
        return wrapped

    def test_fit_resumes_after_an_interrupt(self, tmp_path):
        ref = self._fit(tmp_path / "ref")
        with pytest.raises(Interrupted):
            self._fit(tmp_path / "run", stop_at=4)
        resumed = self._fit(tmp_path / "run")
        mine = self.case.method_parameters(ref)
        assert mine
        for a, b in zip(mine, self.case.method_parameters(resumed), strict=True):
            assert torch.equal(a, b)
        untrained, _ = self.case.make(5)
        moved = self.case.method_parameters(untrained)
        assert any(not torch.equal(a, b) for a, b in zip(mine, moved, strict=True))

    def test_beam_search_scores_are_the_methods_own(self):
        if not self.case.searchable:
            pytest.skip(f"{self.case.name} does not generate left to right")
        wrapped, _ = self.case.make(6)
        ids = torch.tensor([PROMPT])
        hyps = beam_search(self.case.search_model(wrapped), ids, num_beams=3, max_new_tokens=4)
        assert len(hyps) == 3
        for h in hyps:
            seq = torch.tensor([PROMPT + h.tokens + ([0] if h.finished else [])])
            lp = self.case.outputs(wrapped, seq)[0].double()
            p = len(PROMPT)
            want = sum(lp[p - 1 + i, t].item() for i, t in enumerate(seq[0, p:].tolist()))
            assert h.score == pytest.approx(want, abs=1e-4)

    def test_batched_searches_equal_each_row_alone(self):
        """A left-padded batch through beam_search_batch and exact_mode_batch: each row what
        the single-input search gives (the wrapper's state follows the rows: FAME's source,
        the pointer's window)."""
        if not self.case.searchable:
            pytest.skip(f"{self.case.name} does not generate left to right")
        wrapped, _ = self.case.make(8)
        model = self.case.search_model(wrapped)
        prompts = [PROMPT, [1, 4], [2, 3, 4, 1, 2]]
        width = max(map(len, prompts))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        for finished in ("aside", "on_beam"):
            kw = dict(num_beams=3, max_new_tokens=4, finished=finished)
            batch = beam_search_batch(model, ids, mask, **kw)
            for p, got in zip(prompts, batch, strict=True):
                want = beam_search(model, torch.tensor([p]), **kw)
                assert [(h.tokens, h.finished) for h in got] == [
                    (h.tokens, h.finished) for h in want
                ]
                assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-4)
        modes = exact_mode_batch(model, ids, mask, max_new_tokens=3)
        for p, got in zip(prompts, modes, strict=True):
            want = exact_mode(model, torch.tensor([p]), max_new_tokens=3)
            assert (got.tokens, got.exact, got.nodes) == (want.tokens, want.exact, want.nodes)
            assert got.log_prob == pytest.approx(want.log_prob, abs=1e-4)

    def test_exact_mode_equals_brute_force(self):
        if not self.case.searchable:
            pytest.skip(f"{self.case.name} does not generate left to right")
        wrapped, _ = self.case.make(7)
        ids = torch.tensor([PROMPT])
        r = exact_mode(self.case.search_model(wrapped), ids, max_new_tokens=3)
        best, arg = -math.inf, None
        for n in range(4):
            for seq in itertools.product(range(1, 5), repeat=n):
                full = torch.tensor([PROMPT + list(seq) + [0]])
                lp = self.case.outputs(wrapped, full)[0].double()
                s = sum(lp[len(PROMPT) - 1 + i, t].item() for i, t in enumerate([*seq, 0]))
                if s > best:
                    best, arg = s, list(seq)
        assert r.exact and r.tokens == arg and r.log_prob == pytest.approx(best, abs=1e-4)
