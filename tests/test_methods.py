"""The shared method contract (tests/method_testing.py) for all seven method models: FAME, the
pointer sentinel head, the pointer sentinel-LSTM, the prefix model, the recurrent LM, the NAR
model and the search classifier."""

from __future__ import annotations

import torch
from method_testing import PROMPT, MethodCase, MethodTests, small_llama

from gencraft.focus import FocusConfig, FocusForConditionalGeneration
from gencraft.metrics import windowed_nll
from gencraft.nar import ConvertConfig
from gencraft.nar.model import mlm_to_seq2seq
from gencraft.pointer import PointerSentinelConfig, PointerSentinelHead, PointerSentinelLSTM
from gencraft.prefix import PrefixConfig, PrefixModel
from gencraft.recurrence import RecurrenceConfig, RecurrentLM
from gencraft.search import beam_search
from gencraft.search.train import classifier_for


def _prompt_span(ids: torch.Tensor) -> torch.Tensor:
    # a causal LM's source is the prompt, as during generation and search
    return (torch.arange(ids.shape[1], device=ids.device) < len(PROMPT)).expand_as(ids)


class FocusCase(MethodCase):
    name = "focus"

    def wrap(self, base, seed):
        model = FocusForConditionalGeneration(
            base, FocusConfig(freeze_base=True), frequent_ids=torch.tensor([1])
        )
        with torch.no_grad():  # a head far from zero, so that f_t matters
            for p in model.head.parameters():
                p.normal_(0, 1.0)
        return model.eval()

    def loss(self, wrapped, ids):
        return wrapped(input_ids=ids, labels=ids, source_mask=_prompt_span(ids)).loss

    def outputs(self, wrapped, ids):
        with torch.no_grad():
            out = wrapped(input_ids=ids, source_mask=_prompt_span(ids))
        return torch.log_softmax(out.logits.float(), -1)

    def bad_config(self):
        FocusConfig(mle_weight=2.0)


class PointerHeadCase(MethodCase):
    name = "pointer-head"

    def wrap(self, base, seed):
        head = PointerSentinelHead(base, window=4, base_name_or_path="small-llama")
        with torch.no_grad():
            head.query.weight.normal_(0, 1.0)
            head.sentinel.normal_(0, 1.0)
        return head.eval()

    def loss(self, wrapped, ids):
        return wrapped(ids).loss

    def outputs(self, wrapped, ids):
        with torch.no_grad():
            return wrapped(ids, return_log_probs=True).log_probs

    def bad_config(self):
        PointerSentinelHead(small_llama(0, vocab=5), window=0)


class PointerLSTMCase(MethodCase):
    """The paper's model, trained as a whole: disabled, it is the plain LSTM with the same
    weights (gate 1); it wraps no base."""

    name = "pointer-lstm"
    wraps_base = False
    searchable = False

    def base(self, seed):
        return None

    def wrap(self, base, seed):
        cfg = PointerSentinelConfig(vocab_size=5, hidden_size=8, num_layers=1, window=4)
        return PointerSentinelLSTM(cfg).eval()

    def loss(self, wrapped, ids):
        return wrapped(ids[:, :-1], ids[:, 1:]).nll.mean()

    def outputs(self, wrapped, ids):
        with torch.no_grad():
            return wrapped(ids[:, :-1], ids[:, 1:]).nll

    def base_outputs(self, base, ids, wrapped):
        with torch.no_grad():
            return wrapped(ids[:, :-1], ids[:, 1:], force_gate=True).nll

    def bad_config(self):
        PointerSentinelConfig(vocab_size=5, window=0)


class PrefixCase(MethodCase):
    name = "prefix"
    searchable = False  # decodes through the base's generate() with its prefix cache

    def wrap(self, base, seed):
        model = PrefixModel(base, PrefixConfig(num_virtual_tokens=3, init_seed=seed))
        return model.eval()

    def method_parameters(self, wrapped):
        return list(wrapped.prefix.parameters())

    def loss(self, wrapped, ids):
        return wrapped(ids, labels=ids).loss

    def outputs(self, wrapped, ids):
        with torch.no_grad():
            return torch.log_softmax(wrapped(ids).logits.float(), -1)

    def bad_config(self):
        PrefixConfig(num_virtual_tokens=0)


class RecurrenceCase(MethodCase):
    """Disabled, the same windows run with no state between them: the base's windowed NLL."""

    name = "recurrence"
    searchable = False

    def wrap(self, base, seed):
        cfg = RecurrenceConfig(
            window=4, overlap=1, insert_layer=1, ffn_hidden=(8,), train_base=False
        )
        model = RecurrentLM(base, cfg)
        with torch.no_grad():  # an h_prev far from zero, so the recurrence matters
            for p in model.ffn.parameters():
                p.normal_(0, 1.0)
        return model.eval()

    def method_parameters(self, wrapped):
        return [wrapped.layer_logits, *wrapped.ffn.parameters()]

    def loss(self, wrapped, ids):
        return wrapped(ids).loss

    def outputs(self, wrapped, ids):
        return windowed_nll(wrapped, ids, window=4, overlap=1)

    def base_outputs(self, base, ids, wrapped):
        return windowed_nll(base, ids, window=4, overlap=1)

    def bad_config(self):
        RecurrenceConfig(window=4, overlap=4)


class NARCase(MethodCase):
    """The masked LM converted and trained as a whole: no base to switch back to."""

    name = "nar"
    wraps_base = False
    can_disable = False
    searchable = False

    def base(self, seed):
        return None

    def wrap(self, base, seed):
        return mlm_to_seq2seq("tiny-bert", seed=seed, max_target_length=16).eval()

    def _logits(self, wrapped, ids):
        hidden = wrapped.encode(ids).last_hidden_state
        return wrapped.decode_logits(ids, hidden)

    def loss(self, wrapped, ids):
        hidden = wrapped.encode(ids).last_hidden_state
        logits = wrapped.decode_logits(ids, hidden)
        length = torch.full((ids.shape[0],), ids.shape[1], device=ids.device)
        return torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), ids.flatten()
        ) + torch.nn.functional.cross_entropy(wrapped.length_logits(hidden), length)

    def outputs(self, wrapped, ids):
        with torch.no_grad():
            return torch.log_softmax(self._logits(wrapped, ids).float(), -1)

    def bad_config(self):
        ConvertConfig(cross_attention="mirror")


class ClassifierCase(MethodCase):
    """The classifier changes which hypotheses search keeps, not the model's distribution:
    disabled, beam search is plain beam search; it reads a model but wraps none."""

    name = "search-classifier"
    wraps_base = False
    searchable = False

    def wrap(self, base, seed):
        base.requires_grad_(False)
        clf = classifier_for(base, "degenerate", d_clf=8, num_heads=2, d_out=4, mlp_hidden=8)
        clf.__dict__["_test_base"] = base  # not a submodule: the base stays out of its state
        self.last_base = base  # for a classifier loaded from disk
        return clf.eval()

    def loss(self, wrapped, ids):
        logits = self._logits(wrapped, ids)
        target = torch.zeros(logits.shape[:2], dtype=torch.long, device=logits.device)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())

    def _logits(self, clf, ids):
        base = clf.__dict__.get("_test_base", self.last_base)
        with torch.no_grad():
            hs = base(ids, output_hidden_states=True).hidden_states
        hidden = torch.stack(hs, dim=2)  # [1, T, M+1, H]
        return clf(hidden[:, :-1], ids[:, 1:])

    def outputs(self, wrapped, ids):
        with torch.no_grad():
            return self._logits(wrapped, ids)

    def bad_config(self):
        classifier_for(small_llama(0, vocab=5), "degenerate", d_clf=8, num_heads=3)


class TestFocusMethod(MethodTests):
    case = FocusCase()


class TestPointerHeadMethod(MethodTests):
    case = PointerHeadCase()


class TestPointerLSTMMethod(MethodTests):
    case = PointerLSTMCase()


class TestPrefixMethod(MethodTests):
    case = PrefixCase()


class TestRecurrenceMethod(MethodTests):
    case = RecurrenceCase()


class TestNARMethod(MethodTests):
    case = NARCase()


class TestSearchClassifierMethod(MethodTests):
    case = ClassifierCase()

    def test_save_load_gives_identical_outputs(self, tmp_path):
        from gencraft.models.method import load_method
        from gencraft.search.classifier import AttributeClassifier

        clf, base = self.case.make(0)
        ids = self.case.inputs()
        clf.save_pretrained(tmp_path)
        for again in (
            AttributeClassifier.from_pretrained(tmp_path, base),
            load_method(tmp_path, base),
        ):
            again.__dict__["_test_base"] = base
            assert torch.equal(self.case.outputs(clf, ids), self.case.outputs(again, ids))

    def test_disabled_gives_the_base_outputs(self):
        clf, base = self.case.make(1)
        ids = torch.tensor([PROMPT])
        plain = beam_search(base, ids, num_beams=3, max_new_tokens=4)
        kw = dict(num_beams=3, max_new_tokens=4, classifier=clf, alpha=5.0, k=2)
        on = beam_search(base, ids, **kw)
        with clf.disable():
            off = beam_search(base, ids, **kw)
        shown = [[(h.tokens, round(h.score, 5)) for h in hyps] for hyps in (plain, off, on)]
        assert shown[0] == shown[1] != shown[2]
        assert clf.enabled
