"""Faithfulness by entailment (FAME's "Ent."): P(entailment | premise = document, hypothesis =
summary) from any Hugging Face NLI sequence classifier.

No NLI weights are available offline here (nothing installable from PyPI ships one); pass a
local directory or, where the hub is reachable, an id such as ``roberta-large-mnli``. The label
that means entailment is found in the checkpoint's ``id2label`` (any label containing
"entail"), or given with ``entailment_label``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from gencraft.errors import GencraftError


class EntailmentScorer:
    """Args:
    model: a local NLI checkpoint directory or hub id, or an already loaded
        ``(model, tokenizer)`` pair.
    entailment_label: index of the entailment class (default: from ``id2label``).
    max_length: premise + hypothesis token budget; the premise (document) is truncated first.
    """

    def __init__(
        self,
        model: str | tuple[Any, Any],
        *,
        entailment_label: int | None = None,
        max_length: int = 512,
        batch_size: int = 8,
        device: str | None = None,
    ) -> None:
        if isinstance(model, str):
            from transformers import AutoModelForSequenceClassification, AutoTokenizer

            try:
                clf = AutoModelForSequenceClassification.from_pretrained(model)
                tok = AutoTokenizer.from_pretrained(model)
            except (OSError, ValueError) as err:
                raise GencraftError(
                    f"cannot load the NLI classifier {model!r}: {str(err).splitlines()[0]} "
                    "(no NLI weights are installed here; give a local checkpoint directory)"
                ) from err
        else:
            clf, tok = model
        self.model, self.tokenizer = clf.eval(), tok
        if device is not None:
            self.model.to(device)
        labels = {int(k): str(v).lower() for k, v in clf.config.id2label.items()}
        if entailment_label is None:
            found = [i for i, name in labels.items() if "entail" in name and "not" not in name]
            if len(found) != 1:
                raise GencraftError(
                    f"cannot tell the entailment class from id2label {labels}; pass "
                    "entailment_label="
                )
            entailment_label = found[0]
        if not 0 <= entailment_label < clf.config.num_labels:
            raise GencraftError(
                f"entailment_label {entailment_label} outside [0, {clf.config.num_labels})"
            )
        self.entailment_label = entailment_label
        self.max_length, self.batch_size = max_length, batch_size

    def scores(self, premises: Sequence[str], hypotheses: Sequence[str]) -> list[float]:
        """P(entailment) for each (premise, hypothesis) pair, in batches of ``batch_size``
        pairs (one classifier call each, no graph)."""
        if len(premises) != len(hypotheses):
            raise GencraftError(
                f"{len(premises)} premises but {len(hypotheses)} hypotheses; they must pair up"
            )
        dev = next(self.model.parameters()).device
        out: list[float] = []
        for i in range(0, len(premises), self.batch_size):
            enc = self.tokenizer(
                list(premises[i : i + self.batch_size]),
                list(hypotheses[i : i + self.batch_size]),
                truncation="only_first",
                max_length=self.max_length,
                padding=True,
                return_tensors="pt",
            ).to(dev)
            with torch.no_grad():
                probs = torch.softmax(self.model(**enc).logits.float(), dim=-1)
            out += probs[:, self.entailment_label].tolist()
        return out

    def __call__(self, documents: Sequence[str], summaries: Sequence[str]) -> float:
        """FAME's Ent.: mean P(entailment) x 100, documents as premises."""
        s = self.scores(documents, summaries)
        return 100.0 * sum(s) / len(s) if s else 0.0
