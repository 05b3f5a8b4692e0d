"""The few-shot classification of the HSO claim, piece by piece against references
written from the definitions: the tasks built from the corpora (on small files written here),
the label tokens (the longest shared prefix that leaves every label a token), the prompts
(class-balanced, from the short pool, shuffled, seeded), and each method's label (the argmax
over the label tokens of the next-token logits: plain, after ``hso_prefill``, or with the
weights dynamically evaluated), alone and in batches, with its model calls and refusals."""

from __future__ import annotations

import copy
import math
import random
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gencraft.errors import GencraftError
from gencraft.hso.config import DynamicEvalConfig, HSOConfig
from gencraft.hso.dynamic import dynamically_evaluated
from gencraft.hso.fewshot import (
    FewShotTask,
    _last_logits,
    build_task,
    classify,
    classify_batch,
    draw_prompt,
    label_token_ids,
)
from gencraft.hso.functional import hso_prefill
from gencraft.models.tiny import build_tiny_tokenizer

TOK = build_tiny_tokenizer()


def _merging_tokenizer():
    """The tiny byte tokenizer with " a" and " b" merged into one token each, which adds a
    BOS token unless told not to: a label's first token need not be the space, and a call
    that forgets ``add_special_tokens=False`` shows."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    vocab = dict(TOK.get_vocab())
    vocab.update({"\u0120a": len(vocab), "\u0120b": len(vocab) + 1})
    merges = [("\u0120", "a"), ("\u0120", "b")]
    core = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", unk_token="<unk>")


MERGING = _merging_tokenizer()
TOKENIZERS = pytest.mark.parametrize("tok", [TOK, MERGING], ids=["bytes", "merging"])
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True)

# ---- the tasks, from small corpora written here ----------------------------------------

_E2E = [
    ("name[A], familyFriendly[yes]", "A is nice."),
    ("name[B], familyFriendly[no]", "B is no place for a child."),
    ("name[C]", "C is for kids."),  # no familyFriendly attribute: not a row
    ("name[A], familyFriendly[yes]", "A welcomes KIDS."),  # the same MR, later: grouped
    ("name[A], familyFriendly[yes]", "A is for children too."),  # a second match: not kept
    ("name[D], familyFriendly[yes]", "D suits families."),  # "families" has no "family"
    ("name[B], familyFriendly[no]", "B: no kids."),
]


def _csv(path, rows) -> None:
    import csv

    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["mr", "ref"])
        w.writerows(rows)


def _entry(category: str, eid: int, lexes: list[str]) -> str:
    lex = "".join(f"<lex>{t}</lex>" for t in lexes)
    triples = "<modifiedtripleset><mtriple>a | b | c</mtriple></modifiedtripleset>"
    return f'<entry category="{category}" eid="Id{eid}" size="1">{triples}{lex}</entry>'


def _xml(path, entries: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"<benchmark><entries>{''.join(entries)}</entries></benchmark>")


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    (root / "e2e").mkdir()
    _csv(root / "e2e" / "trainset.csv", _E2E)
    _csv(root / "e2e" / "devset.csv", _E2E[:1])
    _csv(root / "e2e" / "testset_w_refs.csv", [("name[E], familyFriendly[no]", "E: Family-free.")])
    web = root / "webnlg"
    _xml(
        web / "train" / "1triples" / "a.xml",
        [
            _entry("Airport", 1, ["An airport.", "A second airport text."]),
            _entry("Astronaut", 2, ["Not a topic."]),
            _entry("City", 3, []),  # no text: not a row
            _entry("Food", 4, ["A food."]),
        ],
    )
    _xml(web / "train" / "2triples" / "b.xml", [_entry("City", 5, ["A city."])])
    _xml(web / "dev" / "1triples" / "c.xml", [_entry("Food", 6, ["A dev food."])])
    _xml(web / "test" / "testdata_with_lex.xml", [_entry("Building", 7, ["A building."])])
    return root


def test_the_family_task_keeps_each_mrs_first_mention_with_its_label(corpora):
    task = build_task("e2e-family", str(corpora))
    assert (task.name, task.field, task.answer) == ("e2e-family", "Review", "Family friendly")
    assert task.labels == ("yes", "no")
    # MRs in order of first appearance; each one's first reference with family, kid or child
    assert task.pool == [("A welcomes KIDS.", 0), ("B is no place for a child.", 1)]
    assert task.test == [("E: Family-free.", 1)]


def test_the_topic_task_keeps_each_entrys_first_text_of_the_four_topics(corpora):
    task = build_task("webnlg-topic", str(corpora))
    assert (task.name, task.field, task.answer) == ("webnlg-topic", "Sentence", "Topic")
    assert task.labels == ("Airport", "Food", "Building", "City")
    assert task.pool == [("An airport.", 0), ("A food.", 1), ("A city.", 3)]
    assert task.test == [("A building.", 2)]


def test_an_unknown_task_is_named_with_the_choices(corpora):
    msg = "unknown few-shot task 'sst2'; choose one of e2e-family, webnlg-topic"
    with pytest.raises(GencraftError, match=f"^{re.escape(msg)}$"):
        build_task("sst2", str(corpora))


# ---- label tokens ------------------------------------------------------------------------

_WORDS = st.text(alphabet="abc", min_size=1, max_size=4)


@TOKENIZERS
@SETTINGS
@given(labels=st.lists(_WORDS, min_size=2, max_size=4, unique=True))
def test_label_tokens_are_the_longest_shared_prefix_that_leaves_each_label_a_token(tok, labels):
    seqs = [tok(" " + w, add_special_tokens=False).input_ids for w in labels]
    shortest = min(len(q) for q in seqs)
    c = max(c for c in range(shortest) if len({tuple(q[:c]) for q in seqs}) == 1)
    ids = [q[c] for q in seqs]
    if len(set(ids)) < len(ids):
        msg = f"the labels {tuple(labels)} cannot be told apart by one token"
        with pytest.raises(GencraftError, match=f"^{re.escape(msg)}$"):
            label_token_ids(tok, tuple(labels))
        return
    assert label_token_ids(tok, tuple(labels)) == (seqs[0][:c], ids)


def test_label_tokens_of_known_labels():
    def ids(text: str) -> list[int]:
        return TOK(text, add_special_tokens=False).input_ids

    y, n, s, a = (ids(c)[0] for c in "ynsa")
    assert label_token_ids(TOK, ("yes", "no")) == (ids(" "), [y, n])
    # "yes"/"yea" share " ye" and differ in their last letter
    assert label_token_ids(TOK, ("yes", "yea")) == (ids(" ye"), [s, a])
    # merged: " a" is one token and " c" two, so nothing is shared
    merged = MERGING(" a", add_special_tokens=False).input_ids
    space_c = MERGING(" c", add_special_tokens=False).input_ids
    assert len(merged) == 1 and len(space_c) == 2
    assert label_token_ids(MERGING, ("a", "c")) == ([], [merged[0], space_c[0]])


# ---- prompts -----------------------------------------------------------------------------


def _blocks(task: FewShotTask, text: str) -> tuple[list[tuple[str, int]], str]:
    """A decoded prompt's (text, label) examples, and what follows them."""
    parts = text.split("\n\n")
    pairs = []
    for block in parts[:-1]:
        line, answer = block.split("\n")
        assert line.startswith(f"{task.field}: ") and answer.startswith(f"{task.answer}: ")
        label = answer[len(task.answer) + 2 :]
        pairs.append((line[len(task.field) + 2 :], task.labels.index(label)))
    return pairs, parts[-1]


@st.composite
def _prompt_cases(draw):
    k = draw(st.integers(2, 3))
    per = draw(st.integers(1, 3))
    pool = [
        (f"t{i}" + " a" * draw(st.integers(0, 3)), draw(st.integers(0, k - 1)))
        for i in range(draw(st.integers(4, 16)))
    ]
    limit = draw(st.integers(2, 9))
    return k, per, pool, limit, draw(st.integers(0, 10**6))


@TOKENIZERS
@SETTINGS
@given(case=_prompt_cases())
def test_a_prompt_is_a_class_balanced_draw_of_short_examples_then_the_text(tok, case):
    k, per, pool, limit, seed = case
    task = FewShotTask("toy", "Text", "Label", ("yes", "no", "maybe")[:k], pool, [])
    short = [p for p in pool if len(tok(p[0], add_special_tokens=False).input_ids) <= limit]
    counts = [sum(y == c for _, y in short) for c in range(k)]
    n = per * k
    if min(counts) < per:
        y = next(c for c in range(k) if counts[c] < per)  # the first class short of n / k
        msg = (
            f"toy: only {counts[y]} {task.labels[y]!r} examples of at most {limit} tokens "
            f"for prompts of n = {n}"
        )
        with pytest.raises(GencraftError, match=f"^{re.escape(msg)}$"):
            draw_prompt(task, tok, n, "q", random.Random(seed), max_example_tokens=limit)
        return
    shared = [7, 9]
    ids = draw_prompt(task, tok, n, "q", random.Random(seed), limit, shared=shared)
    assert ids.shape[0] == 1 and ids.dtype == torch.long and ids[0, -2:].tolist() == shared
    pairs, tail = _blocks(task, tok.decode(ids[0, :-2]))
    assert tail == "Text: q\nLabel:"
    assert [sum(y == c for _, y in pairs) for c in range(k)] == [per] * k
    assert len(set(pairs)) == n and set(pairs) <= set(short)  # drawn without replacement
    body = "".join(f"Text: {t}\nLabel: {task.labels[y]}\n\n" for t, y in pairs)
    assert ids[0, :-2].tolist() == tok(body + "Text: q\nLabel:", add_special_tokens=False).input_ids


def test_prompts_vary_with_the_seed_in_content_and_order_and_repeat_with_it():
    pool = [(f"e{i}", i % 2) for i in range(40)]
    task = FewShotTask("toy", "Text", "Label", ("yes", "no"), pool, [])
    drawn = {
        tuple(_blocks(task, TOK.decode(draw_prompt(task, TOK, 4, "q", random.Random(s))[0]))[0])
        for s in range(20)
    }
    assert len(drawn) == 20  # new examples with each seed
    orders = {tuple(y for _, y in pairs) for pairs in drawn}
    assert len(orders) > 1  # shuffled, not grouped by class
    a = draw_prompt(task, TOK, 4, "q", random.Random(3))
    assert torch.equal(a, draw_prompt(task, TOK, 4, "q", random.Random(3)))
    assert draw_prompt(task, TOK, 4, "q", random.Random(3), shared=None).shape == a.shape


def test_the_short_pool_follows_the_token_limit_of_each_call():
    task = FewShotTask("toy", "Text", "Label", ("yes", "no"), [("ab", 0), ("cd", 1)], [])
    with pytest.raises(GencraftError, match="only 0 'yes' examples of at most 1 tokens"):
        draw_prompt(task, TOK, 2, "q", random.Random(0), max_example_tokens=1)
    assert draw_prompt(task, TOK, 2, "q", random.Random(0), max_example_tokens=2).shape[1] > 0
    # the default limit is 35 tokens: a 35-character text fits, a 36-character one does not
    task = FewShotTask("toy", "Text", "Label", ("yes", "no"), [("a" * 35, 0), ("b" * 36, 1)], [])
    with pytest.raises(GencraftError, match="only 0 'no' examples of at most 35 tokens"):
        draw_prompt(task, TOK, 2, "q", random.Random(0))


def test_the_short_pool_is_each_tokenizers_own():
    # "x a a" is 5 byte tokens and 3 merged ones
    pool = [("x a a", 0), ("y a a", 1)]
    for first, second in ((TOK, MERGING), (MERGING, TOK)):
        task = FewShotTask("toy", "Text", "Label", ("yes", "no"), pool, [])
        for tok in (first, second):
            if tok is TOK:
                with pytest.raises(GencraftError, match="only 0 'yes' examples of at most 3"):
                    draw_prompt(task, tok, 2, "q", random.Random(0), max_example_tokens=3)
            else:
                assert draw_prompt(task, tok, 2, "q", random.Random(0), 3).shape[0] == 1


def test_n_must_be_a_multiple_of_the_classes_word_for_word():
    task = FewShotTask("toy", "Text", "Label", ("a", "b", "c"), [("x", 0)], [])
    msg = "n = 4 is not a multiple of the 3 classes of toy"
    with pytest.raises(GencraftError, match=f"^{re.escape(msg)}$"):
        draw_prompt(task, TOK, 4, "q", random.Random(0))


# ---- labels read from the model ----------------------------------------------------------

HSO = HSOConfig(window=4, lr=0.5)
DE = DynamicEvalConfig(window=4, lr=0.05)


def _reference_logits(model, ids: torch.Tensor, method: str) -> torch.Tensor:
    """[V]: the next-token logits after ``ids`` [1, P] under ``method``, from the definitions."""
    with torch.no_grad():
        if method == "baseline":
            return model(input_ids=ids).logits[0, -1]
        if method == "dynamic eval":
            with dynamically_evaluated(model, ids, DE):
                return model(input_ids=ids).logits[0, -1]
        steps = 2 if method == "hso2" else 1
        cache = hso_prefill(model, ids, HSOConfig(window=4, lr=0.5, steps=steps))
        return model(input_ids=ids[:, -1:], past_key_values=cache).logits[0, -1]


def _telling_labels(logits: dict[str, torch.Tensor]) -> list[list[int]]:
    """Label sets whose argmax differs between methods, and the whole vocabulary."""
    sets = [list(range(next(iter(logits.values())).numel()))]
    for m, own in logits.items():
        a = int(own.argmax())
        for other, lg in logits.items():
            # b: below a by a margin under m, above it by a margin under the other method
            b = ((own[a] - own > 1e-3) & (lg - lg[a] > 1e-3)).nonzero().flatten()
            if other != m and b.numel():
                sets.append([int(b[0]), a])
    return sets


def _prompts(seed: int, lengths: list[int]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 200, (1, n), generator=g) for n in lengths]


@pytest.fixture(scope="module")
def references(llama):
    out = []
    for p in _prompts(5, [11, 6, 14, 9]):
        logits = {m: _reference_logits(llama, p, m) for m in ("baseline", "hso", "hso2")}
        logits["dynamic eval"] = _reference_logits(llama, p, "dynamic eval")
        out.append((p, logits, _telling_labels(logits)))
    return out


@pytest.mark.parametrize("method", ["baseline", "hso", "hso2", "dynamic eval"])
def test_each_method_reads_the_argmax_of_its_own_logits_over_the_labels(llama, references, method):
    for p, logits, label_sets in references:
        for labels in label_sets:
            want = int(logits[method][labels].argmax())
            assert classify(llama, p, labels, method, HSO, DE) == want, (method, labels)


@pytest.mark.parametrize(
    ("method", "size", "de_size"),
    [
        ("baseline", 1, 1),
        ("baseline", 3, 1),
        ("hso", 2, 1),
        ("hso2", 4, 1),
        ("dynamic eval", 1, 1),
        ("dynamic eval", 1, 3),
    ],
)
def test_a_batch_reads_each_prompts_own_label(llama, references, method, size, de_size):
    prompts = [p for p, _, _ in references]
    for labels in [s for _, _, sets in references for s in sets]:
        want = [int(lg[method][labels].argmax()) for _, lg, _ in references]
        got = classify_batch(
            llama, prompts, labels, method, HSO, DE, batch_size=size, de_batch_size=de_size
        )
        assert got == want, (method, labels)


def _count_calls(model) -> tuple[list[int], object]:
    calls: list[int] = []
    hook = model.register_forward_pre_hook(lambda m, a, k: calls.append(1), with_kwargs=True)
    return calls, hook


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8])
def test_the_baseline_takes_one_model_call_per_batch(llama, size):
    prompts = _prompts(1, [5, 9, 7, 12, 6])
    calls, hook = _count_calls(llama)
    try:
        got = classify_batch(llama, prompts, [4, 5, 6], "baseline", HSO, DE, batch_size=size)
    finally:
        hook.remove()
    assert len(got) == 5 and len(calls) == math.ceil(5 / size)


def test_the_batch_size_defaults_to_eight(llama):
    prompts = _prompts(2, [4] * 9)
    calls, hook = _count_calls(llama)
    try:
        classify_batch(llama, prompts, [4, 5], "baseline", HSO, DE)
    finally:
        hook.remove()
    assert len(calls) == 2


@pytest.mark.parametrize(
    ("kwargs", "msg"),
    [
        (
            {"method": "greedy"},
            "unknown method 'greedy'; choose from baseline, dynamic eval, hso, hso2",
        ),
        ({"batch_size": 0}, "batch_size must be >= 1, got 0"),
        ({"de_batch_size": 0}, "de_batch_size must be >= 1, got 0"),
        ({"batch_size": -2, "de_batch_size": 0}, "batch_size must be >= 1, got -2"),
    ],
)
def test_bad_settings_are_refused_word_for_word_before_any_model_call(llama, kwargs, msg):
    args = {"method": "baseline", "batch_size": 8, "de_batch_size": 1, **kwargs}
    method = args.pop("method")
    calls, hook = _count_calls(llama)
    try:
        with pytest.raises(GencraftError, match=f"^{re.escape(msg)}$"):
            classify_batch(llama, _prompts(0, [4, 5]), [4, 5], method, HSO, DE, **args)
    finally:
        hook.remove()
    assert calls == []


def test_dynamic_evaluation_adapts_one_prompt_at_a_time_by_default(llama, monkeypatch):
    from gencraft.hso import fewshot

    batched: list[int] = []
    real = fewshot.dynamic_eval_last_logits
    monkeypatch.setattr(
        fewshot,
        "dynamic_eval_last_logits",
        lambda m, ids, *a: batched.append(1) or real(m, ids, *a),
    )
    prompts = _prompts(6, [5, 7, 6])
    one = classify_batch(llama, prompts, [4, 5, 6], "dynamic eval", HSO, DE)
    assert batched == []
    assert (
        classify_batch(llama, prompts, [4, 5, 6], "dynamic eval", HSO, DE, de_batch_size=2) == one
    )
    assert batched == [1, 1]


@pytest.mark.parametrize("method", ["baseline", "hso"])
def test_a_prompt_may_fill_the_context_but_one_token(llama, method):
    hso = HSOConfig(window=64)
    ids = _prompts(7, [511])
    assert classify_batch(llama, ids, [4, 5, 6], method, hso, DE) == [
        classify(llama, ids[0], [4, 5, 6], method, hso, DE)
    ]
    msg = (
        "a prompt of 512 tokens plus max_new_tokens=1 exceeds the model's context of 512 positions"
    )
    with pytest.raises(GencraftError, match=f"^{re.escape(msg)}$"):
        classify_batch(llama, _prompts(7, [512]), [4, 5, 6], method, hso, DE)


def test_one_prompt_refuses_an_unknown_method_word_for_word(llama):
    msg = "unknown method 'hso3'; choose from baseline, dynamic eval, hso, hso2"
    with pytest.raises(GencraftError, match=f"^{re.escape(msg)}$"):
        classify(llama, _prompts(0, [4])[0], [4, 5], "hso3", HSO, DE)


def test_the_last_logits_are_float32_and_the_cache_path_feeds_only_the_last_token(llama):
    ids = _prompts(3, [10])[0]
    full = llama(input_ids=ids).logits[0, -1]
    plain = _last_logits(llama, ids)
    assert plain.dtype == torch.float32 and plain.shape == full.shape
    assert not plain.requires_grad
    assert torch.allclose(plain, full, atol=1e-5, rtol=0)
    # on the states of the first P - 1 tokens, the last token alone gives the same logits
    cache = llama(input_ids=ids[:, :-1], use_cache=True).past_key_values
    cached = _last_logits(llama, ids, cache)
    assert torch.allclose(cached, full, atol=1e-5, rtol=0)
    assert _last_logits(copy.deepcopy(llama).to(torch.bfloat16), ids).dtype == torch.float32
