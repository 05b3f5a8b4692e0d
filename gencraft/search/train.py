"""Training data for attribute classifiers from the model's own samples, and their training.

The thesis is explicit that the classifier must learn P_model(a | prefix), so it is trained on
samples of the model (ancestral sampling: temperature 1, no top-k/top-p), not on natural text.
Each sample gives one training sequence: the frozen model's hidden states from the last prompt
position on ([T, M+1, H], stored in float16), the generated tokens ([T]), and per-position
labels ([T]; -100 = ignored). For the length attribute, samples cut at ``max_new_tokens``
have no known length and are ignored by default (the thesis's samples all ended); with
``censored=True`` they carry lower-bound labels instead, trained with the censored likelihood
-log P(class >= label) (see docs/search.md).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gencraft.errors import GencraftError
from gencraft.models.introspect import (
    check_generator,
    decoder_start_id,
    eos_ids,
    fingerprint,
    model_name,
)
from gencraft.models.prompts import pad_batch
from gencraft.models.sampling import sample_batch
from gencraft.progress import tqdm
from gencraft.search.classifier import (
    NUM_LENGTH_BUCKETS,
    AttributeClassifier,
    ClassifierConfig,
    censored_nll,
    degenerate,
    length_labels,
    state_dims,
)
from gencraft.search.config import ClassifierTrainConfig
from gencraft.training import write_json


@dataclass
class _Sampler:
    """What labelling one sample needs: the model, its EOS set and pad id, the attribute and
    its labeler."""

    model: nn.Module
    tokenizer: Any
    attribute: str
    labeler: Callable[[str, str, bool], bool]
    censored: bool
    prompt_texts: Sequence[str] | None
    eos: set[int] = field(init=False)
    pad: int = field(init=False)
    encoder_decoder: bool = field(init=False)
    device: torch.device = field(init=False)

    def __post_init__(self) -> None:
        model = self.model
        self.encoder_decoder = bool(model.config.is_encoder_decoder)
        self.eos = set(eos_ids(model, None))
        pad = model.generation_config.pad_token_id
        self.pad = pad if pad is not None else next(iter(self.eos))
        self.device = next(model.parameters()).device

    def ancestral(
        self, prompts: Sequence[torch.Tensor], indices: Sequence[int], n: int, steps: int, seed: int
    ) -> list[list[int]]:
        """``n`` plain ancestral samples of each prompt ([1, P] each), all in one batch of
        B·n rows (:func:`~gencraft.models.sampling.sample_batch`): the raw next-token
        distribution, no logits processors (the distribution the search steps through).
        Prompt ``indices[b]`` draws from its own generator, seeded ``seed`` + that index.
        Returns B·n token lists (prompt 0's n first), each cut after its first EOS."""
        rows = [{"input_ids": p.flatten().tolist()} for p in prompts]
        batch = pad_batch(rows, self.pad, left=not self.encoder_decoder)
        return sample_batch(
            self.model,
            batch["input_ids"],
            batch["attention_mask"],
            n=n,
            max_new_tokens=steps,
            seeds=[seed + i for i in indices],
            eos_token_id=sorted(self.eos),
        )

    def hidden(self, ids: torch.Tensor, samples: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The decoder's hidden states at every layer, from the last input position before the
        first sampled token on, of each sample ([T_i]) of prompt ``ids`` [1, P]: one model call
        over the samples right-padded (causal: padding after a row leaves its states alone).
        Returns [T_i, M + 1, H] each, float16 on the CPU."""
        p = 1 if self.encoder_decoder else ids.shape[1]  # decoder inputs before the sample
        head = torch.tensor([decoder_start_id(self.model)]) if self.encoder_decoder else ids[0]
        fed = [torch.cat([head.cpu(), s[:-1]]) for s in samples]
        width = max(len(f) for f in fed)
        full = torch.full((len(fed), width), self.pad, dtype=torch.long)
        for r, f in enumerate(fed):
            full[r, : len(f)] = f
        full = full.to(self.device)
        with torch.no_grad():
            if self.encoder_decoder:
                src = ids.to(self.device).expand(len(fed), -1)
                hs = self.model(
                    input_ids=src,
                    attention_mask=torch.ones_like(src),
                    decoder_input_ids=full,
                    output_hidden_states=True,
                ).decoder_hidden_states
            else:
                hs = self.model(full, output_hidden_states=True).hidden_states
        states = torch.stack(hs, dim=2)  # [n, L, M + 1, H]
        return [states[r, p - 1 : p - 1 + len(s)].half().cpu() for r, s in enumerate(samples)]

    def labels(self, index: int, ids: torch.Tensor, gen: list[int], finished: bool) -> list[int]:
        """One label per sampled token: remaining-length buckets, or the sample's one label."""
        if self.attribute == "length":
            return length_labels(len(gen), finished, censored=self.censored)
        text = self.tokenizer.decode(
            [t for t in gen if t not in self.eos], skip_special_tokens=True
        )
        texts = self.prompt_texts
        ptext = texts[index] if texts is not None else self.tokenizer.decode(ids[0])
        return [int(self.labeler(text, ptext, finished))] * len(gen)

    def row(self, index: int, ids: torch.Tensor, gen: list[int]) -> dict[str, Any] | None:
        """One sample ``gen`` (its tokens, through its EOS if it ended) of prompt ``index`` as
        a training row without its hidden states (None when it is empty)."""
        if not gen:
            return None
        finished = gen[-1] in self.eos
        cut = self.attribute == "length" and self.censored and not finished
        return {
            "tokens": torch.tensor(gen),
            "labels": torch.tensor(self.labels(index, ids, gen, finished)),
            "prompt_index": torch.tensor(index),
            "finished": torch.tensor(finished),
            "censored": torch.tensor(cut),
        }


def sample_training_data(
    model: nn.Module,
    tokenizer: Any,
    prompts: Sequence[torch.Tensor],
    *,
    attribute: str = "length",
    samples_per_prompt: int = 4,
    max_new_tokens: int = 64,
    prompt_texts: Sequence[str] | None = None,
    labeler: Callable[[str, str, bool], bool] = degenerate,
    censored: bool = False,
    seed: int = 0,
    progress: bool = True,
    first: int = 0,
    batch_size: int = 8,
    hidden: bool = True,
) -> list[dict[str, torch.Tensor]]:
    """Ancestral samples of a causal LM or encoder-decoder for each prompt ([1, P] each: the
    prompt, or the encoder input), with the decoder's hidden states and labels, drawn
    ``batch_size`` prompts (× ``samples_per_prompt`` rows) at a time. Prompt ``i`` is prompt
    ``first + i`` of the whole set (its ``prompt_index``, its entry of ``prompt_texts``, and
    its seed, ``seed`` + that index), so a set sampled in chunks gives the samples of one pass.
    ``attribute``: ``"length"`` (remaining-length buckets) or ``"degenerate"`` (one label per
    sample from ``labeler(text, prompt_text, finished)``). ``censored``: samples of
    the length attribute cut at ``max_new_tokens`` get lower-bound labels (else -100).
    ``hidden=False`` leaves the states out (rows small enough to store; see
    :func:`attach_hidden`, which computes them exactly as this function does)."""
    if attribute not in ("length", "degenerate"):
        raise GencraftError(f"attribute must be 'length' or 'degenerate', got {attribute!r}")
    if samples_per_prompt < 1:
        raise GencraftError(f"samples_per_prompt must be >= 1, got {samples_per_prompt}")
    if max_new_tokens < 1:
        raise GencraftError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if batch_size < 1:
        raise GencraftError(f"batch_size must be >= 1, got {batch_size}")
    if not prompts:
        raise GencraftError("no prompts to sample from")
    check_generator(model, "a classifier's training data")
    sampler = _Sampler(model, tokenizer, attribute, labeler, censored, prompt_texts)
    rows: list[dict[str, torch.Tensor]] = []
    starts = range(0, len(prompts), batch_size)
    for s in tqdm(starts, desc="sampling", unit="batch", disable=not progress):
        chunk = prompts[s : s + batch_size]
        indices = [first + s + b for b in range(len(chunk))]
        gens = sampler.ancestral(chunk, indices, samples_per_prompt, max_new_tokens, seed)
        for j, gen in enumerate(gens):
            b = j // samples_per_prompt
            row = sampler.row(indices[b], chunk[b], gen)
            if row is not None:
                rows.append(row)
    return attach_hidden(model, rows, prompts, first=first) if hidden else rows


def attach_hidden(
    model: nn.Module,
    rows: list[dict[str, torch.Tensor]],
    prompts: Sequence[torch.Tensor],
    *,
    first: int = 0,
    progress: bool = False,
) -> list[dict[str, torch.Tensor]]:
    """``rows`` (of :func:`sample_training_data`, stored without states) with their
    ``hidden`` [T, M + 1, H] float16 states: one model call per prompt over its samples.
    Row ``r`` is a sample of ``prompts[r["prompt_index"] - first]``."""
    sampler = _Sampler(model, None, "length", degenerate, False, None)
    groups: dict[int, list[int]] = {}
    for j, r in enumerate(rows):
        groups.setdefault(int(r["prompt_index"]), []).append(j)
    out = list(rows)
    for index, members in tqdm(groups.items(), desc="hidden states", disable=not progress):
        if not 0 <= index - first < len(prompts):
            raise GencraftError(f"a row names prompt {index}, outside the {len(prompts)} given")
        states = sampler.hidden(prompts[index - first], [rows[j]["tokens"] for j in members])
        for j, h in zip(members, states, strict=True):
            out[j] = {**rows[j], "hidden": h}
    return out


def relabel_degenerate(
    rows: list[dict[str, torch.Tensor]],
    tokenizer: Any,
    prompt_texts: Sequence[str],
    eos_token_ids: Sequence[int],
    labeler: Callable[[str, str, bool], bool] = degenerate,
) -> list[dict[str, torch.Tensor]]:
    """The same samples with "degenerate" labels instead (one per sample, every position), so
    one round of sampling serves both attributes."""
    eos = set(eos_token_ids)
    out = []
    for r in rows:
        text = tokenizer.decode(
            [t for t in r["tokens"].tolist() if t not in eos], skip_special_tokens=True
        )
        bad = labeler(text, prompt_texts[int(r["prompt_index"])], bool(r["finished"]))
        out.append(
            {**r, "labels": torch.full_like(r["tokens"], int(bad)), "censored": torch.tensor(False)}
        )
    return out


def classifier_for(
    model: nn.Module, attribute: str = "length", **overrides: Any
) -> AttributeClassifier:
    """A fresh classifier sized for ``model``'s hidden states, bound to its embeddings."""
    layers, hidden, emb = state_dims(model)
    classes = NUM_LENGTH_BUCKETS if attribute == "length" else 2
    c = ClassifierConfig(
        num_layers=layers,
        hidden_size=hidden,
        embed_size=emb,
        num_classes=classes,
        attribute=attribute,
        model_name=model_name(model),
        model_fingerprint=fingerprint(model),
        **overrides,
    )
    return AttributeClassifier(c).bind(model)


def collate_rows(chunk: list[dict]) -> tuple[torch.Tensor, ...]:
    """Pad a list of sampled sequences: (hidden [B, T, M+1, H] float16, tokens [B, T],
    labels [B, T] (-100 = ignored), pad [B, T] bool, censored [B, T] bool)."""
    t = max(r["tokens"].shape[0] for r in chunk)
    b = len(chunk)
    m, h = chunk[0]["hidden"].shape[1:]
    hidden = torch.zeros(b, t, m, h, dtype=torch.float16)
    tokens = torch.zeros(b, t, dtype=torch.long)
    labels = torch.full((b, t), -100, dtype=torch.long)
    pad = torch.ones(b, t, dtype=torch.bool)
    censored = torch.zeros(b, t, dtype=torch.bool)
    for j, r in enumerate(chunk):
        n = r["tokens"].shape[0]
        hidden[j, :n], tokens[j, :n], labels[j, :n] = r["hidden"], r["tokens"], r["labels"]
        pad[j, :n] = False
        censored[j, :n] = bool(r.get("censored", False))
    return hidden, tokens, labels, pad, censored


def _nll(clf: nn.Module, batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    hidden, tokens, labels, pad, censored = batch
    logits = clf(hidden, tokens, pad)
    return censored_nll(logits, labels, censored)


def _loss(clf: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    total, count = _nll(clf, batch)
    return total / count.clamp_min(1)


def _valid_loss(clf: nn.Module, loader: Any) -> dict[str, float]:
    """The per-position mean NLL over the whole validation set."""
    total, count = 0.0, 0
    for batch in loader:
        t, n = _nll(clf, batch)
        total, count = total + float(t), count + int(n)
    return {"loss": total / max(count, 1)}


def _split_rows(
    rows: list[dict[str, torch.Tensor]], config: ClassifierTrainConfig
) -> tuple[list[dict[str, torch.Tensor]], list[dict[str, torch.Tensor]]]:
    """(train, valid): a seeded shuffle, ``valid_fraction`` of the rows (at least one) for
    validation; refuses too few rows or rows without a labelled position."""
    if len(rows) < 2:
        raise GencraftError(f"need at least 2 training sequences, got {len(rows)}")
    if all(bool((r["labels"] == -100).all()) for r in rows):
        raise GencraftError(
            "no labelled position: no sample ended within max_new_tokens, so no final length "
            "is known; sample with a larger max_new_tokens"
        )
    order = list(range(len(rows)))
    random.Random(config.fit.seed).shuffle(order)
    n_valid = max(1, int(len(rows) * config.valid_fraction))
    train, valid = [rows[i] for i in order[n_valid:]], [rows[i] for i in order[:n_valid]]
    for name, part in (("validation", valid), ("training", train)):
        if all(bool((r["labels"] == -100).all()) for r in part):  # a loss over 0 positions
            raise GencraftError(
                f"none of the {len(part)} {name} samples has a labelled position (each was cut "
                "at max_new_tokens, so its final length is unknown); sample with a larger "
                "max_new_tokens or more prompts"
            )
    return train, valid


def train_classifier(
    clf: AttributeClassifier,
    rows: list[dict[str, torch.Tensor]],
    config: ClassifierTrainConfig,
    output_dir: str | Path | None = None,
    *,
    progress: bool = True,
    resume: bool = True,
    restart: bool = False,
) -> dict[str, Any]:
    """Per-position cross-entropy over the classes (ignoring -100; the censored likelihood
    for rows flagged ``censored``), Adam, through :func:`gencraft.training.fit` (one
    validation per epoch; resumable). Ends with the weights of the best validation loss
    (``output_dir/best``; ``last/``, ``checkpoint/`` and ``history.json`` beside it)."""
    import tempfile

    from gencraft.training import fit, settings_of

    train, valid = _split_rows(rows, config)
    n_valid = len(valid)
    torch.manual_seed(config.fit.seed)
    clf.eval()
    with torch.no_grad():
        initial = _valid_loss(clf, [collate_rows(valid[i : i + 8]) for i in range(0, n_valid, 8)])
    opt = torch.optim.Adam(clf.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(output_dir) if output_dir is not None else Path(tmp)
        fitted = fit(
            clf,
            opt,
            train,
            loss_fn=_loss,
            config=config.fit,
            output_dir=out,
            valid=valid,
            collate_fn=collate_rows,
            evaluate_fn=_valid_loss,
            save_fn=lambda m, d: m.save_pretrained(d),
            settings={
                "train_config": settings_of(config),
                "sequences": len(rows),
                "classifier": asdict(clf.config),
            },
            resume=resume,
            restart=restart,
            progress=progress,
        )
        best = AttributeClassifier.from_pretrained(out / "best")
        clf.load_state_dict(best.state_dict())
    clf.eval()
    history = [{"epoch": 0, "valid_loss": initial["loss"]}] + [
        {"epoch": int(h["epoch"]), "train_loss": h.get("train_loss"), "valid_loss": h["valid_loss"]}
        for h in fitted.history
    ]
    sizes = {"train_sequences": len(train), "valid_sequences": len(valid)}
    result = {"config": asdict(config), **sizes, "best_valid_loss": fitted.best, "history": history}
    if output_dir is not None:
        write_json(Path(output_dir) / "result.json", result)
    return result
