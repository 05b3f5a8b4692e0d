"""The shared method contract (tests/method_testing.py) for every landed method that wraps a
model: FAME (causal and encoder-decoder), the pointer sentinel head, and the search
classifier (whose contract is about search, not the model's distribution)."""

from __future__ import annotations

import pytest
import torch
from method_testing import PROMPT, MethodCase, MethodTests, small_llama

from gencraft.focus import FocusConfig, FocusForConditionalGeneration
from gencraft.pointer import PointerSentinelHead
from gencraft.search import beam_search
from gencraft.search.train_classifier import classifier_for


class FocusCase(MethodCase):
    name = "focus"

    def make(self, seed):
        base = small_llama(seed, vocab=5)
        torch.manual_seed(seed + 100)
        model = FocusForConditionalGeneration(
            base, FocusConfig(freeze_base=True), frequent_ids=torch.tensor([1])
        )
        with torch.no_grad():  # a head far from zero, so that f_t matters
            for p in model.head.parameters():
                p.normal_(0, 1.0)
        return model.eval(), base

    def method_parameters(self, wrapped):
        return list(wrapped.head.parameters())

    @staticmethod
    def _prompt_span(ids):
        # a causal LM's source is the prompt, as during generation and search
        return (torch.arange(ids.shape[1]) < len(PROMPT)).expand_as(ids)

    def loss(self, wrapped, ids):
        return wrapped(input_ids=ids, labels=ids, source_mask=self._prompt_span(ids)).loss

    def log_probs(self, wrapped, ids):
        with torch.no_grad():
            out = wrapped(input_ids=ids, source_mask=self._prompt_span(ids))
        return torch.log_softmax(out.logits.float(), -1)

    def switch_off(self, wrapped):
        wrapped.enabled = False

    def save_load(self, wrapped, base, path):
        wrapped.save_pretrained(path, save_base=False)
        wrapped.remove()  # one FAME wrapper per base
        return FocusForConditionalGeneration.from_pretrained(path, base_model=base).eval()


class PointerCase(MethodCase):
    name = "pointer-head"

    def make(self, seed):
        base = small_llama(seed, vocab=5)
        torch.manual_seed(seed + 100)
        head = PointerSentinelHead(base, window=4, base_name_or_path="small-llama")
        with torch.no_grad():
            head.query.weight.normal_(0, 1.0)
            head.sentinel.normal_(0, 1.0)
        return head.eval(), base

    def method_parameters(self, wrapped):
        return [wrapped.query.weight, wrapped.query.bias, wrapped.sentinel]

    def loss(self, wrapped, ids):
        return wrapped(ids).loss

    def log_probs(self, wrapped, ids):
        with torch.no_grad():
            return wrapped(ids, return_log_probs=True).log_probs

    def switch_off(self, wrapped):
        # the gate saturates at 1: q = tanh(b) ≈ 1, the sentinel outscores every state
        with torch.no_grad():
            wrapped.query.weight.zero_()
            wrapped.query.bias.fill_(10.0)
            wrapped.sentinel.fill_(1e4)

    def save_load(self, wrapped, base, path):
        wrapped.save_pretrained(path, save_base=False)
        return PointerSentinelHead.from_pretrained(path, base_model=base).eval()


class TestFocusMethod(MethodTests):
    case = FocusCase()


class TestPointerHeadMethod(MethodTests):
    case = PointerCase()


class ClassifierCase(MethodCase):
    name = "search-classifier"

    def make(self, seed):
        base = small_llama(seed, vocab=5)
        base.requires_grad_(False)
        torch.manual_seed(seed + 100)
        clf = classifier_for(base, "degenerate", d_clf=8, num_heads=2, d_out=4, mlp_hidden=8)
        return clf.eval(), base

    def outputs(self, clf, base, ids):
        with torch.no_grad():
            hs = base(ids, output_hidden_states=True).hidden_states
        hidden = torch.stack(hs, dim=2)  # [1, T, M+1, H]
        return clf(hidden[:, :-1], ids[:, 1:])


class TestSearchClassifierMethod(MethodTests):
    """The classifier changes which hypotheses search keeps, not the model's distribution:
    its contract is stated on search."""

    case = ClassifierCase()

    def test_save_load_gives_identical_outputs(self, tmp_path):
        from gencraft.search.classifier import AttributeClassifier

        clf, base = self.case.make(0)
        ids = self._ids()
        clf.save_pretrained(tmp_path)
        again = AttributeClassifier.from_pretrained(tmp_path, base)
        assert torch.equal(self.case.outputs(clf, base, ids), self.case.outputs(again, base, ids))

    def test_method_off_equals_the_base_model(self):
        clf, base = self.case.make(1)
        ids = torch.tensor([PROMPT])
        plain = beam_search(base, ids, num_beams=3, max_new_tokens=4)
        off = beam_search(base, ids, num_beams=3, max_new_tokens=4, classifier=clf, alpha=0.0)
        assert [(h.tokens, round(h.score, 5)) for h in off] == [
            (h.tokens, round(h.score, 5)) for h in plain
        ]

    def test_gradients_reach_only_the_method_parameters(self):
        clf, base = self.case.make(2)
        clf.train()
        logits = self.case.outputs(clf, base, self._ids(2))
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), torch.zeros(7).long()).backward()
        assert all(p.grad is not None for p in clf.parameters() if p.requires_grad)
        assert all(p.grad is None for p in base.parameters())

    def test_beam_search_scores_are_the_methods_own(self):
        clf, base = self.case.make(3)
        ids = torch.tensor([PROMPT])
        hyps = beam_search(base, ids, num_beams=3, max_new_tokens=4, classifier=clf, k=3)
        assert len(hyps) == 3
        for h in hyps:  # scores stay the model's log-likelihood, the classifier only selects
            seq = torch.tensor([PROMPT + h.tokens + ([0] if h.finished else [])])
            lp = self.case.base_log_probs(base, seq)[0].double()
            want = sum(lp[len(PROMPT) - 1 + i, t].item() for i, t in enumerate(seq[0, 3:]))
            assert h.score == pytest.approx(want, abs=1e-4)

    def test_exact_mode_equals_brute_force(self):
        pytest.skip("exact mode search takes no classifier (the thesis's ch. 6 has none)")
