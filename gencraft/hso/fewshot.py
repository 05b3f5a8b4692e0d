"""Few-shot classification with HSO (Yoshida 2023, §3.7 / Table 3.4), on tasks built from the
local data-to-text corpora (no SST-2 or AGNews offline):

* ``e2e-family`` (binary, the SST-2 analogue): for each E2E MR with
  ``familyFriendly[yes|no]``, its first reference text that contains "family", "kid" or
  "child" in any case ("family-friendly", "kids", "children"; "families" alone does not
  count); label yes/no;
* ``webnlg-topic`` (4-way, the AGNews analogue): the first reference text of each WebNLG
  entry of the Airport, Food, Building or City category; label the category.

Prompts follow Zhao et al. (2021): ``<Field>: text`` / ``<Answer field>: label`` blocks, a
blank line between them, the test text last, and the label read from the next-token
probabilities of the label words' first tokens. As in the thesis, a class-balanced prompt is
drawn afresh for every test example (the same for every method), and only texts of at most
``max_example_tokens`` tokens go into prompts.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

import torch
from torch import nn

from gencraft.errors import GencraftError
from gencraft.hso.config import DynamicEvalConfig, HSOConfig
from gencraft.hso.dynamic import dynamic_eval_last_logits, dynamically_evaluated
from gencraft.hso.functional import hso_prefill
from gencraft.models.compat import cache_kwargs

TASKS = ("e2e-family", "webnlg-topic")
METHODS = ("baseline", "dynamic eval", "hso", "hso2")
_FAMILY = re.compile(r"family|kid|child", re.I)
_TOPICS = ("Airport", "Food", "Building", "City")


@dataclass
class FewShotTask:
    """``pool``: (text, label index) pairs prompts are drawn from; ``test``: the same for test
    examples; ``labels``: the label words; fields name the prompt's two lines."""

    name: str
    field: str
    answer: str
    labels: tuple[str, ...]
    pool: list[tuple[str, int]]
    test: list[tuple[str, int]]
    _short: dict = dataclass_field(default_factory=dict, repr=False)


#: each task's prompt fields and label words
_FIELDS = {
    "e2e-family": ("Review", "Family friendly", ("yes", "no")),
    "webnlg-topic": ("Sentence", "Topic", _TOPICS),
}


def build_task(name: str, data_dir: str | None = None) -> FewShotTask:
    """The task ``name``: prompts drawn from its training split, test examples from its test
    split (:func:`task_rows`)."""
    if name not in _FIELDS:
        raise GencraftError(f"unknown few-shot task {name!r}; choose one of {', '.join(TASKS)}")
    rows = (task_rows(name, split, data_dir) for split in ("train", "test"))
    return FewShotTask(name, *_FIELDS[name], *rows)


def task_rows(name: str, split: str, data_dir: str | None = None) -> list[tuple[str, int]]:
    """(text, label index) of every example of task ``name`` in ``split`` (the module
    docstring says which text and label)."""
    from gencraft.data.data2text import load_data_to_text

    out = []
    if name == "e2e-family":
        for ex in load_data_to_text("e2e", split, data_dir):
            mr = ex.meta["mr"]
            label = 0 if "familyFriendly[yes]" in mr else 1 if "familyFriendly[no]" in mr else None
            if label is not None:
                out += [(r, label) for r in ex.references if _FAMILY.search(r)][:1]
        return out
    if name == "webnlg-topic":
        for ex in load_data_to_text("webnlg", split, data_dir):
            cat = ex.meta.get("category")
            if cat in _TOPICS and ex.references:
                out.append((ex.references[0], _TOPICS.index(cat)))
        return out
    raise GencraftError(f"unknown few-shot task {name!r}; choose one of {', '.join(TASKS)}")


def label_token_ids(tok: Any, labels: tuple[str, ...]) -> tuple[list[int], list[int]]:
    """(shared, ids): the tokens every " label" starts with (appended to the prompt; none for
    a BPE tokenizer, the space for a byte one) and each label's first token after them."""
    seqs = [tok(" " + w, add_special_tokens=False).input_ids for w in labels]
    c = 0
    while all(len(q) > c + 1 for q in seqs) and len({q[c] for q in seqs}) == 1:
        c += 1
    ids = [q[c] for q in seqs]
    if len(set(ids)) != len(ids):
        raise GencraftError(f"the labels {labels} cannot be told apart by one token")
    return seqs[0][:c], ids


def draw_prompt(
    task: FewShotTask,
    tok: Any,
    n: int,
    text: str,
    rng: random.Random,
    max_example_tokens: int = 35,
    shared: list[int] | None = None,
) -> torch.Tensor:
    """[1, P]: ``n`` class-balanced examples (shuffled) and the test text, ending in the answer
    field's colon and the ``shared`` label tokens."""
    k = len(task.labels)
    if n % k:
        raise GencraftError(f"n = {n} is not a multiple of the {k} classes of {task.name}")
    key = (id(tok), max_example_tokens)
    if key not in task._short:  # the pool's texts that fit, tokenised once
        task._short[key] = [
            (t, y)
            for t, y in task.pool
            if len(tok(t, add_special_tokens=False).input_ids) <= max_example_tokens
        ]
    chosen = []
    for y in range(k):
        cands = [p for p in task._short[key] if p[1] == y]
        if len(cands) < n // k:
            raise GencraftError(
                f"{task.name}: only {len(cands)} {task.labels[y]!r} examples of at most "
                f"{max_example_tokens} tokens for prompts of n = {n}"
            )
        chosen += rng.sample(cands, n // k)
    rng.shuffle(chosen)
    blocks = [f"{task.field}: {t}\n{task.answer}: {task.labels[y]}\n\n" for t, y in chosen]
    prompt = "".join(blocks) + f"{task.field}: {text}\n{task.answer}:"
    return torch.tensor([tok(prompt, add_special_tokens=False).input_ids + list(shared or [])])


def _last_logits(model: nn.Module, ids: torch.Tensor, cache=None) -> torch.Tensor:
    """[V] float32: the next-token logits after prompt ``ids`` [1, P], or after its last token
    on ``cache`` (the states of the tokens before it)."""
    with torch.no_grad():
        if cache is None:
            return model(input_ids=ids).logits[0, -1].float()
        return model(input_ids=ids[:, -1:], **cache_kwargs(cache)).logits[0, -1].float()


def classify(
    model: nn.Module,
    ids: torch.Tensor,
    label_ids: list[int],
    method: str,
    hso: HSOConfig,
    de: DynamicEvalConfig,
) -> int:
    """The predicted label index after prompt ``ids`` [1, P] under ``method``."""
    if method == "baseline":
        logits = _last_logits(model, ids)
    elif method in ("hso", "hso2"):
        cfg = HSOConfig(**{**hso.__dict__, "steps": 2 if method == "hso2" else 1})
        logits = _last_logits(model, ids, hso_prefill(model, ids, cfg))
    elif method == "dynamic eval":
        with dynamically_evaluated(model, ids, de):
            logits = _last_logits(model, ids)
    else:
        raise GencraftError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    return int(torch.argmax(logits[label_ids]))


def classify_batch(
    model: nn.Module,
    prompts: list[torch.Tensor],
    label_ids: list[int],
    method: str,
    hso: HSOConfig,
    de: DynamicEvalConfig,
    *,
    batch_size: int = 8,
    de_batch_size: int = 1,
) -> list[int]:
    """:func:`classify` for many prompts (each [1, P]): ``batch_size`` of them at a time,
    left-padded, in one forward (baseline) or one batched HSO prefill and one step (HSO,
    HSO-2). Dynamic evaluation adapts the weights to each prompt: one prompt at a time, or
    ``de_batch_size`` together, each with its own copy of the weights
    (:func:`~gencraft.hso.dynamic.dynamic_eval_last_logits`: that many copies in memory)."""
    from gencraft.models.prompts import left_padded_batches
    from gencraft.models.stepping import HFStepper

    if method not in METHODS:
        raise GencraftError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    for name, value in (("batch_size", batch_size), ("de_batch_size", de_batch_size)):
        if value < 1:
            raise GencraftError(f"{name} must be >= 1, got {value}")
    with torch.no_grad():
        dev = next(model.parameters()).device  # prompts are drawn on the CPU
        if method == "dynamic eval" and de_batch_size == 1:
            return [classify(model, p.to(dev), label_ids, method, hso, de) for p in prompts]
        if method == "dynamic eval":
            out = []
            for _, ids, mask in left_padded_batches(model, None, prompts, de_batch_size):
                # torch.func.grad inside takes its gradients under this function's no_grad too
                logits = dynamic_eval_last_logits(model, ids.to(dev), mask.to(dev), de)
                out += logits[:, label_ids].argmax(1).tolist()
            return out
        labels = torch.tensor(label_ids)
        out: list[int] = []
        for _, ids, mask in left_padded_batches(model, None, prompts, batch_size):
            ids, mask = ids.to(dev), mask.to(dev)
            stepper = HFStepper(model, ids, attention_mask=mask, max_new_tokens=1)
            if method == "baseline":
                logp = stepper.start().log_probs
            else:
                cfg = HSOConfig(**{**hso.__dict__, "steps": 2 if method == "hso2" else 1})
                cache = hso_prefill(model, ids, cfg, attention_mask=mask)
                logp = stepper.step(ids[:, -1], cache).log_probs  # the last token on the states
            out += logp[:, labels.to(logp.device)].argmax(-1).tolist()
        return out
