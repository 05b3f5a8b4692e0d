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

import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from gencraft.errors import GencraftError
from gencraft.search.classifier import (
    NUM_LENGTH_BUCKETS,
    AttributeClassifier,
    ClassifierConfig,
    censored_nll,
    degenerate,
    length_labels,
    state_dims,
)
from gencraft.search.stepper import eos_ids


@dataclass
class ClassifierTrainConfig:
    """Thesis Appendix E: Adam lr 1e-3, weight decay 3e-8, batch 8 (epochs: 3 MT, 8 ROC)."""

    attribute: str = "length"
    epochs: int = 8
    lr: float = 1e-3
    weight_decay: float = 3e-8
    batch_size: int = 8
    valid_fraction: float = 0.1
    seed: int = 0


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
) -> list[dict[str, torch.Tensor]]:
    """Ancestral samples of a causal LM or encoder-decoder for each prompt ([1, P] each: the
    prompt, or the encoder input), with the decoder's hidden states and labels.
    ``attribute``: ``"length"`` (remaining-length buckets) or ``"degenerate"`` (one label per
    sample from ``labeler(text, prompt_text, finished)``). ``censored``: samples of
    the length attribute cut at ``max_new_tokens`` get lower-bound labels (else -100)."""
    if attribute not in ("length", "degenerate"):
        raise GencraftError(f"attribute must be 'length' or 'degenerate', got {attribute!r}")
    ed = bool(model.config.is_encoder_decoder)
    eos = set(eos_ids(model, None))
    pad = model.generation_config.pad_token_id
    pad = pad if pad is not None else next(iter(eos))
    dev = next(model.parameters()).device
    torch.manual_seed(seed)
    rows: list[dict[str, torch.Tensor]] = []
    for i, ids in enumerate(tqdm(prompts, desc="sampling", disable=not progress)):
        ids = ids.to(dev)
        with torch.no_grad():
            # plain ancestral sampling: no logits processors beyond the model's own forced ids
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                top_k=0,
                top_p=1.0,
                temperature=1.0,
                repetition_penalty=1.0,
                no_repeat_ngram_size=0,
                min_length=0,
                num_return_sequences=samples_per_prompt,
                max_new_tokens=max_new_tokens,
                pad_token_id=pad,
            )
        # the decoder input before the first sampled token: the prompt, or the start token
        p = 1 if ed else ids.shape[1]
        for seq in out:
            gen = seq[p:].tolist()
            ends = [j for j, t in enumerate(gen) if t in eos]
            finished = bool(ends)
            gen = gen[: ends[0] + 1] if finished else gen
            if not gen:
                continue
            full = torch.cat([seq[:p], torch.tensor(gen[:-1], device=dev, dtype=torch.long)])
            with torch.no_grad():
                if ed:
                    hs = model(
                        input_ids=ids,
                        attention_mask=torch.ones_like(ids),
                        decoder_input_ids=full[None],
                        output_hidden_states=True,
                    ).decoder_hidden_states
                else:
                    hs = model(full[None], output_hidden_states=True).hidden_states
            states = torch.stack([h[0, p - 1 :] for h in hs], dim=1).half().cpu()  # [T, M+1, H]
            if attribute == "length":
                labels = length_labels(len(gen), finished, censored=censored)
            else:
                text = tokenizer.decode([t for t in gen if t not in eos], skip_special_tokens=True)
                ptext = prompt_texts[i] if prompt_texts is not None else tokenizer.decode(ids[0])
                labels = [int(labeler(text, ptext, finished))] * len(gen)
            rows.append(
                {
                    "hidden": states,
                    "tokens": torch.tensor(gen),
                    "labels": torch.tensor(labels),
                    "prompt_index": torch.tensor(i),
                    "finished": torch.tensor(finished),
                    "censored": torch.tensor(attribute == "length" and censored and not finished),
                }
            )
    return rows


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
        model_name=getattr(model.config, "_name_or_path", None),
        **overrides,
    )
    return AttributeClassifier(c).bind(model)


def _batches(rows: list[dict], size: int, shuffle: bool, rng: random.Random):
    order = list(range(len(rows)))
    if shuffle:
        rng.shuffle(order)
    for s in range(0, len(order), size):
        chunk = [rows[i] for i in order[s : s + size]]
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
            hidden[j, :n], tokens[j, :n], labels[j, :n], pad[j, :n] = (
                r["hidden"],
                r["tokens"],
                r["labels"],
                False,
            )
            censored[j, :n] = bool(r.get("censored", False))
        yield hidden, tokens, labels, pad, censored


def train_classifier(
    clf: AttributeClassifier,
    rows: list[dict[str, torch.Tensor]],
    config: ClassifierTrainConfig,
    output_dir: str | Path | None = None,
    *,
    progress: bool = True,
) -> dict[str, Any]:
    """Per-position cross-entropy over the classes (ignoring -100; the censored likelihood
    for rows flagged ``censored``), Adam; keeps the weights of
    the best validation loss (saved under ``output_dir``/best; ``last/`` and the history are
    written after every epoch)."""
    from accelerate import Accelerator

    if len(rows) < 2:
        raise GencraftError(f"need at least 2 training sequences, got {len(rows)}")
    if all(bool((r["labels"] == -100).all()) for r in rows):
        raise GencraftError(
            "no labelled position: no sample ended within max_new_tokens, so no final length "
            "is known; sample with a larger max_new_tokens"
        )
    rng = random.Random(config.seed)
    torch.manual_seed(config.seed)
    order = list(range(len(rows)))
    rng.shuffle(order)
    n_valid = max(1, int(len(rows) * config.valid_fraction))
    valid = [rows[i] for i in order[:n_valid]]
    train = [rows[i] for i in order[n_valid:]]
    acc = Accelerator()
    opt = torch.optim.Adam(clf.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    clf, opt = acc.prepare(clf, opt)
    dev = acc.device

    def run(data: list[dict], training: bool) -> float:
        clf.train(training)
        total, count = 0.0, 0
        bar = tqdm(
            list(_batches(data, config.batch_size, training, rng)),
            desc="train" if training else "valid",
            disable=not progress,
            leave=False,
        )
        for batch in bar:
            hidden, tokens, labels, pad, censored = (x.to(dev) for x in batch)
            with torch.set_grad_enabled(training):
                logits = clf(hidden, tokens, pad)
                total_nll, count_t = censored_nll(logits, labels, censored)
                n = int(count_t)
                loss = total_nll / max(n, 1)
            if training and n:
                opt.zero_grad()
                acc.backward(loss)
                opt.step()
            if n:
                total += loss.item() * n
                count += n
        return total / max(count, 1)

    history = [{"epoch": 0, "valid_loss": run(valid, False)}]
    best = history[0]["valid_loss"]
    best_state = {k: v.detach().clone() for k, v in acc.unwrap_model(clf).state_dict().items()}
    for epoch in tqdm(range(1, config.epochs + 1), desc="epochs", disable=not progress):
        tr = run(train, True)
        va = run(valid, False)
        history.append({"epoch": epoch, "train_loss": tr, "valid_loss": va})
        if va < best or math.isnan(best):
            best = va
            best_state = {
                k: v.detach().clone() for k, v in acc.unwrap_model(clf).state_dict().items()
            }
        if output_dir is not None and acc.is_main_process:  # a checkpoint per epoch
            acc.unwrap_model(clf).save_pretrained(Path(output_dir) / "last")
            (Path(output_dir) / "history.json").write_text(json.dumps(history, indent=2))
    model = acc.unwrap_model(clf)
    model.load_state_dict(best_state)
    model.eval()
    result = {
        "config": asdict(config),
        "train_sequences": len(train),
        "valid_sequences": len(valid),
        "best_valid_loss": best,
        "history": history,
    }
    if output_dir is not None:
        out = Path(output_dir)
        model.save_pretrained(out / "best")
        (out / "history.json").write_text(json.dumps(result, indent=2))
    return result
