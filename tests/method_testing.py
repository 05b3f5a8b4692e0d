"""The checks every gencraft method passes (peft's ``testing_common`` idea): a method case
describes how to build the method on a tiny model, and :class:`MethodTests` runs the same
contract on each case:

* save -> load gives identical outputs;
* the method switched off equals the base model;
* gradients reach only the method's parameters;
* gencraft's ``beam_search`` runs on the wrapped model and agrees with the method's own
  scoring of the sequences it returns; ``exact_mode`` on the wrapped model equals brute force.

A case subclass sets ``make(seed)`` and the hooks below; ``tests/test_methods.py`` lists them.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from gencraft.search import beam_search, exact_mode

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


class MethodCase:
    """How to build and drive one method (override in subclasses)."""

    name = "method"

    def make(self, seed: int) -> tuple[nn.Module, nn.Module]:
        """(wrapped model, its base) on a tiny model."""
        raise NotImplementedError

    def method_parameters(self, wrapped: nn.Module) -> list[nn.Parameter]:
        raise NotImplementedError

    def loss(self, wrapped: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def log_probs(self, wrapped: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        """Next-token log-probabilities [B, T, V] of the method."""
        raise NotImplementedError

    def switch_off(self, wrapped: nn.Module) -> None:
        raise NotImplementedError

    def base_log_probs(self, base: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return torch.log_softmax(base(ids).logits.float(), -1)

    def save_load(self, wrapped: nn.Module, base: nn.Module, path) -> nn.Module:
        wrapped.save_pretrained(path)
        return type(wrapped).from_pretrained(path, base_model=base)

    def search_model(self, wrapped: nn.Module) -> Any:
        """What gencraft's searches are given (the wrapped model by default)."""
        return wrapped


class MethodTests:
    """Mix into a test class together with a :class:`MethodCase`."""

    case: MethodCase

    def _ids(self, seed: int = 0) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        return torch.cat([torch.tensor([PROMPT]), torch.randint(1, 5, (1, 5), generator=g)], 1)

    def test_save_load_gives_identical_outputs(self, tmp_path):
        wrapped, base = self.case.make(0)
        ids = self._ids()
        before = self.case.log_probs(wrapped, ids)
        again = self.case.save_load(wrapped, base, tmp_path / "saved")
        assert torch.equal(before, self.case.log_probs(again, ids))

    def test_method_off_equals_the_base_model(self):
        wrapped, base = self.case.make(1)
        ids = self._ids(1)
        on = self.case.log_probs(wrapped, ids)
        self.case.switch_off(wrapped)
        off = self.case.log_probs(wrapped, ids)
        ref = self.case.base_log_probs(base, ids)
        torch.testing.assert_close(off, ref, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(on, ref, atol=1e-3)  # the method did something when on

    def test_gradients_reach_only_the_method_parameters(self):
        wrapped, _ = self.case.make(2)
        mine = {id(p) for p in self.case.method_parameters(wrapped)}
        self.case.loss(wrapped, self._ids(2)).backward()
        for n, p in wrapped.named_parameters():
            if id(p) in mine:
                assert p.grad is not None and p.grad.abs().sum() > 0, n
            else:
                assert p.grad is None or not p.grad.any(), n

    def test_beam_search_scores_are_the_methods_own(self):
        wrapped, _ = self.case.make(3)
        ids = torch.tensor([PROMPT])
        hyps = beam_search(self.case.search_model(wrapped), ids, num_beams=3, max_new_tokens=4)
        assert len(hyps) == 3
        for h in hyps:
            seq = torch.tensor([PROMPT + h.tokens + ([0] if h.finished else [])])
            lp = self.case.log_probs(wrapped, seq)[0].double()
            p = len(PROMPT)
            want = sum(lp[p - 1 + i, t].item() for i, t in enumerate(seq[0, p:].tolist()))
            assert h.score == pytest_approx(want)

    def test_exact_mode_equals_brute_force(self):
        wrapped, _ = self.case.make(4)
        ids = torch.tensor([PROMPT])
        r = exact_mode(self.case.search_model(wrapped), ids, max_new_tokens=3)
        best, arg = -math.inf, None
        for n in range(4):
            for seq in itertools.product(range(1, 5), repeat=n):
                full = torch.tensor([PROMPT + list(seq) + [0]])
                lp = self.case.log_probs(wrapped, full)[0].double()
                s = sum(lp[len(PROMPT) - 1 + i, t].item() for i, t in enumerate([*seq, 0]))
                if s > best:
                    best, arg = s, list(seq)
        assert r.exact and r.tokens == arg and r.log_prob == pytest_approx(best)


def pytest_approx(x: float):
    import pytest

    return pytest.approx(x, abs=1e-4)
