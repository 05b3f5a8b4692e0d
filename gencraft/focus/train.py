"""Fine-tuning for summarization, with or without FAME, through ``accelerate``.

* ``focus=True``: :class:`FocusForConditionalGeneration`, loss λ·MLE + (1 − λ)·topic, with F the
  |F| most frequent tokens of the training documents and summaries;
* ``focus=False``: the base alone with its MLE loss (the baseline);
* ``freeze_base=True`` (FAME only): the base is fixed; with ``precompute`` (the default then)
  it runs once per example and epochs train the head on stored states
  (:mod:`gencraft.focus.features`), which is what makes CPU training practical.

Each epoch ends with the validation loss; ``best/`` keeps the lowest, ``last/`` the latest,
``history.json`` the curve. Both are loadable with :func:`load_summarizer`.
"""

from __future__ import annotations

import math
import random
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn
from tqdm.auto import tqdm

from gencraft.data.summarization import SummarizationExample
from gencraft.errors import GencraftError
from gencraft.focus.data import SummaryEncoder, collate
from gencraft.focus.features import HeadFeatures, collect_features, head_losses
from gencraft.focus.model import FOCUS_CONFIG, FocusConfig, FocusForConditionalGeneration
from gencraft.focus.topic import frequent_token_ids
from gencraft.training import write_json


@dataclass
class FocusTrainConfig:
    """Attributes:
    focus: train FAME (else the plain base: the baseline).
    freeze_base: train only the FAME head.
    precompute: with a frozen base, run the base once and train on stored states (default).
    lr: AdamW learning rate (linear warm-up over ``warmup`` of the steps, then linear decay).
    batch_size, grad_accum, epochs, max_steps, max_time (seconds of training), clip.
    frequent_size: |F| (paper: 500 for XSum, 1000 for CNN/DM).
    mle_weight: λ. frequent: "negative" (paper) | "ignore".
    max_source, max_target: token budgets (paper: 512 and 64 for XSum).
    """

    focus: bool = True
    freeze_base: bool = False
    precompute: bool | None = None
    lr: float = 5e-5
    batch_size: int = 8
    grad_accum: int = 1
    epochs: int = 3
    max_steps: int | None = None
    max_time: float | None = None
    warmup: float = 0.1
    weight_decay: float = 0.0
    clip: float = 1.0
    frequent_size: int = 500
    mle_weight: float = 0.5
    frequent: Literal["negative", "ignore"] = "negative"
    max_source: int = 512
    max_target: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        if self.freeze_base and not self.focus:
            raise GencraftError("--freeze-base trains only the FAME head; it needs focus=True")
        if self.batch_size < 1 or self.grad_accum < 1 or self.epochs < 1:
            raise GencraftError("batch_size, grad_accum and epochs must be positive")
        if self.precompute and not self.freeze_base:
            raise GencraftError("precompute needs a frozen base (freeze_base=True)")
        if self.precompute is None:
            self.precompute = self.freeze_base


def load_summarizer(
    path: str, **load_kw: Any
) -> tuple[nn.Module, Any]:  # (FocusForConditionalGeneration | PreTrainedModel, tokenizer)
    """A trained FAME model or plain model from a directory, or any registered model name."""
    from transformers import AutoTokenizer

    from gencraft.models import load_model

    p = Path(path)
    if (p / FOCUS_CONFIG).is_file():
        model = FocusForConditionalGeneration.from_pretrained(p, **load_kw)
        tok = AutoTokenizer.from_pretrained(p)
        return model.eval(), _causal_padding(model, tok)
    return load_model(path, **load_kw)


def _causal_padding(model: FocusForConditionalGeneration, tok: Any) -> Any:
    if not model.is_encoder_decoder:
        tok.padding_side = "left"
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
    return tok


class FocusTrainer:
    """Args:
    base: the Hugging Face model to fine-tune (or to put FAME on).
    tokenizer: its tokenizer.
    train, valid: summarization examples.
    config: :class:`FocusTrainConfig`.
    output_dir: where ``best/``, ``last/`` and ``history.json`` go.
    base_name_or_path: recorded so a frozen base need not be saved.
    """

    def __init__(
        self,
        base: nn.Module,
        tokenizer: Any,
        train: Sequence[SummarizationExample],
        valid: Sequence[SummarizationExample],
        config: FocusTrainConfig,
        output_dir: str | Path,
        *,
        base_name_or_path: str | None = None,
        progress: bool = True,
    ) -> None:
        from accelerate import Accelerator

        if not train:
            raise GencraftError("no training examples")
        self.cfg, self.tok, self.progress = config, tokenizer, progress
        self.out = Path(output_dir)
        self.accelerator = Accelerator(gradient_accumulation_steps=config.grad_accum)
        torch.manual_seed(config.seed)
        random.seed(config.seed)
        is_ed = bool(base.config.is_encoder_decoder)
        self.encoder = SummaryEncoder(tokenizer, is_ed, config.max_source, config.max_target)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.train_rows = [self.encoder.encode(e.document, e.summary) for e in train]
        self.valid_rows = [self.encoder.encode(e.document, e.summary) for e in valid]
        if config.focus:
            special = set(tokenizer.all_special_ids)
            corpus = [r["input_ids"] for r in self.train_rows] + [
                [t for t in r["labels"] if t >= 0] for r in self.train_rows
            ]
            freq = frequent_token_ids(corpus, config.frequent_size, exclude=special)
            fcfg = FocusConfig(
                mle_weight=config.mle_weight,
                frequent=config.frequent,
                freeze_base=config.freeze_base,
                base_name_or_path=base_name_or_path,
            )
            self.model: nn.Module = FocusForConditionalGeneration(base, fcfg, frequent_ids=freq)
        else:
            self.model = base
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
        self.history: list[dict[str, Any]] = []
        self.train_time = 0.0
        self.step = 0
        self.trained_examples = 0

    # ------------------------------------------------------------------ batches
    def _batches(self, rows: list, shuffle: bool) -> list[list]:
        order = list(range(len(rows)))
        if shuffle:
            random.shuffle(order)
        bs = self.cfg.batch_size
        return [[rows[i] for i in order[j : j + bs]] for j in range(0, len(order), bs)]

    def _features(self, rows: list, desc: str) -> tuple[list[HeadFeatures], torch.Tensor]:
        feats: list[HeadFeatures] = []
        residual = None
        model = self.accelerator.unwrap_model(self.model)
        dev = self.accelerator.device
        for chunk in tqdm(self._batches(rows, False), desc=desc, disable=not self.progress):
            batch = {k: v.to(dev) for k, v in collate(chunk, self.pad_id).items()}
            f, r = collect_features(model, batch)
            feats += f
            residual = r if residual is None else residual
        return feats, residual

    def _loss(self, batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
        if self.cfg.precompute:
            feats, residual = batch
            loss, mle, topic = head_losses(
                self.accelerator.unwrap_model(self.model), feats, residual
            )
            return loss, {"mle": mle.item(), "topic": topic.item()}
        out = self.model(**batch)
        parts = {"mle": (out.mle_loss if self.cfg.focus else out.loss).item()}
        if self.cfg.focus:
            parts["topic"] = out.topic_loss.item()
        return out.loss, parts

    def _prepare(self, rows: list, shuffle: bool, feats: Any = None) -> list:
        if self.cfg.precompute:
            items, residual = feats
            order = list(range(len(items)))
            if shuffle:
                random.shuffle(order)
            bs = self.cfg.batch_size
            return [
                ([items[i] for i in order[j : j + bs]], residual) for j in range(0, len(order), bs)
            ]
        dev = self.accelerator.device
        return [
            {k: v.to(dev) for k, v in collate(c, self.pad_id).items()}
            for c in self._batches(rows, shuffle)
        ]

    # ------------------------------------------------------------------ loop
    @torch.no_grad()
    def validate(self, valid_feats: Any = None) -> dict[str, float]:
        self.model.eval()
        sums: dict[str, float] = {}
        n = 0
        for batch in self._prepare(self.valid_rows, False, valid_feats):
            loss, parts = self._loss(batch)
            for k, v in {"loss": loss.item(), **parts}.items():
                sums[k] = sums.get(k, 0.0) + v
            n += 1
        self.model.train()
        return {k: v / max(n, 1) for k, v in sums.items()}

    def train(self) -> dict[str, Any]:
        cfg, acc = self.cfg, self.accelerator
        train_feats = valid_feats = None
        if cfg.precompute:
            train_feats = self._features(self.train_rows, "base states (train)")
            valid_feats = self._features(self.valid_rows, "base states (valid)")
        steps_per_epoch = math.ceil(
            math.ceil(len(self.train_rows) / cfg.batch_size) / cfg.grad_accum
        )
        total = cfg.max_steps or steps_per_epoch * cfg.epochs
        from transformers import get_linear_schedule_with_warmup

        sched = get_linear_schedule_with_warmup(self.optimizer, int(cfg.warmup * total), total)
        self.model, self.optimizer, sched = acc.prepare(self.model, self.optimizer, sched)
        self.model.train()
        if cfg.precompute:
            acc.unwrap_model(self.model).base.eval()  # frozen base: no dropout in features
        best = math.inf
        done = False
        bar = tqdm(total=total, desc="train", disable=not self.progress)
        for epoch in range(cfg.epochs):
            t0 = time.perf_counter()
            for batch in self._prepare(self.train_rows, True, train_feats):
                with acc.accumulate(self.model):
                    loss, parts = self._loss(batch)
                    acc.backward(loss)
                    if acc.sync_gradients:
                        acc.clip_grad_norm_(self.model.parameters(), cfg.clip)
                    self.optimizer.step()
                    sched.step()
                    self.optimizer.zero_grad()
                self.trained_examples += (
                    len(batch[0]) if cfg.precompute else len(batch["input_ids"])
                )
                if acc.sync_gradients:
                    self.step += 1
                    bar.update(1)
                    bar.set_postfix(
                        loss=f"{loss.item():.3f}", **{k: f"{v:.3f}" for k, v in parts.items()}
                    )
                elapsed = self.train_time + time.perf_counter() - t0
                if self.step >= total or (cfg.max_time and elapsed >= cfg.max_time):
                    done = True
                    break
            self.train_time += time.perf_counter() - t0
            val = self.validate(valid_feats) if self.valid_rows else {}
            row = {
                "epoch": epoch + 1,
                "step": self.step,
                "train_time": self.train_time,
                **{f"valid_{k}": v for k, v in val.items()},
            }
            self.history.append(row)
            if self.progress:
                tqdm.write(f"epoch {epoch + 1}: {row}")
            self.save(self.out / "last")
            if val.get("loss", -math.inf) < best or not self.valid_rows:
                best = val.get("loss", best)
                self.save(self.out / "best")
            if done:
                break
        bar.close()
        write_json(self.out / "history.json", self.history)
        return {
            "steps": self.step,
            "train_time": self.train_time,
            "trained_examples": self.trained_examples,
            "best_valid_loss": best,
        }

    def save(self, directory: Path) -> None:
        if not self.accelerator.is_main_process:
            return
        model = self.accelerator.unwrap_model(self.model)
        if directory.exists():  # never mix a FAME save with a plain one
            shutil.rmtree(directory)
        model.save_pretrained(directory)
        self.tok.save_pretrained(directory)
        write_json(directory / "train_config.json", asdict(self.cfg))
