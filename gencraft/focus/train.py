"""Fine-tuning for summarization, with or without FAME, through ``accelerate``.

* ``focus=True``: :class:`FocusForConditionalGeneration`, loss λ·MLE + (1 − λ)·topic, with F the
  |F| most frequent tokens of the training documents and summaries;
* ``focus=False``: the base alone with its MLE loss (the baseline);
* ``freeze_base=True`` (FAME only): the base is fixed; with ``precompute`` (the default then)
  it runs once per example and epochs train the head on stored states
  (:mod:`gencraft.focus.features`), which is what makes CPU training practical.

Training runs through :func:`gencraft.training.fit`: each epoch ends with the validation loss
(and, with ``select_by="rougeL"``, the ROUGE-L of beam-searched summaries of the first
``select_docs`` validation documents, the paper's Appendix A rule); ``best/`` keeps the best by
``select_by``, ``last/`` the latest, ``history.json`` the curve (both loadable
with :func:`load_summarizer`); ``checkpoint/`` makes the run resumable (Ctrl-C saves; a re-run
continues or says why not).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gencraft.data.summarization import SummarizationExample
from gencraft.errors import GencraftError
from gencraft.focus.config import FocusTrainConfig
from gencraft.focus.data import SummaryEncoder, collate
from gencraft.focus.features import HeadFeatures, collect_features, head_losses
from gencraft.focus.functional import frequent_token_ids
from gencraft.focus.model import FocusConfig, FocusForConditionalGeneration
from gencraft.models.introspect import check_token_budget, target_eos_id
from gencraft.progress import tqdm
from gencraft.training import (
    fit,
    load_run,
    make_accelerator,
    mean_loss,
    save_directory,
    save_run,
    settings_of,
)


def load_summarizer(path: str, command: str = "eval", **load_kw: Any) -> tuple[nn.Module, Any]:
    """A trained run (:func:`gencraft.training.load_run`: its ``best/``, or a model
    directory), or any registered model name, as (model, tokenizer)."""
    from gencraft.models import load_model

    if Path(path).is_dir():
        model, tok, _ = load_run(path, method="focus", command=command, **load_kw)
        return model, tok
    return load_model(path, **load_kw)


class FocusTrainer:
    """Args:
    base: the Hugging Face model to fine-tune (or to put FAME on).
    tokenizer: its tokenizer.
    train, valid: summarization examples.
    config: :class:`FocusTrainConfig`.
    output_dir: where ``best/``, ``last/`` and ``history.json`` go.
    base_name_or_path: recorded so a frozen base need not be saved.
    data: what the run trained on (``task``, a name or an absolute path, and its
        ``source_field``/``target_field``), recorded so eval and generate default to it.
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
        data: dict[str, str] | None = None,
        progress: bool = True,
    ) -> None:
        if not train:
            raise GencraftError("no training examples")
        self.cfg, self.tok, self.progress = config, tokenizer, progress
        self.out = Path(output_dir)
        self.accelerator = make_accelerator(
            config.fit.mixed_precision,
            config.fit.device,
            gradient_accumulation_steps=config.fit.grad_accum,
        )
        self.base_name_or_path = base_name_or_path
        self.data = dict(data) if data else None
        torch.manual_seed(config.fit.seed)
        is_ed = bool(base.config.is_encoder_decoder)
        eos = target_eos_id(base, tokenizer)  # what generation stops on
        self.encoder = SummaryEncoder(
            tokenizer, is_ed, config.max_source, config.max_target, eos_token_id=eos
        )
        self.encoder.max_source = check_token_budget(  # refused, or cut to fit with a note
            base,
            config.max_source,
            config.max_target,
            ("--max-source", "--max-target"),
            reserve=self.encoder.prompt_tokens,
        )
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.train_rows = [self.encoder.encode(e.document, e.summary) for e in train]
        self.valid_rows = [self.encoder.encode(e.document, e.summary) for e in valid]
        self.valid_examples = list(valid)
        self.model: nn.Module = self._fame(base) if config.focus else base
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
        self.history: list[dict[str, Any]] = []
        self.train_time = 0.0
        self.step = 0
        self.trained_examples = 0

    def _fame(self, base: nn.Module) -> FocusForConditionalGeneration:
        """FAME on ``base``, its frequent set F from the training documents and summaries
        (special tokens excluded)."""
        config = self.cfg
        corpus = [r["input_ids"] for r in self.train_rows] + [
            [t for t in r["labels"] if t >= 0] for r in self.train_rows
        ]
        special = set(self.tok.all_special_ids)
        freq = frequent_token_ids(corpus, config.frequent_size, exclude=special)
        fcfg = FocusConfig(
            mle_weight=config.mle_weight,
            frequent=config.frequent,
            freeze_base=config.freeze_base,
            base_name_or_path=self.base_name_or_path,
        )
        return FocusForConditionalGeneration(base, fcfg, frequent_ids=freq)

    # ------------------------------------------------------------------ batches
    def _features(self, rows: list, desc: str) -> tuple[list[HeadFeatures], torch.Tensor]:
        feats: list[HeadFeatures] = []
        residual = None
        dev = next(self.model.parameters()).device
        bs = self.cfg.fit.batch_size
        chunks = [rows[j : j + bs] for j in range(0, len(rows), bs)]
        for chunk in tqdm(chunks, desc=desc, disable=not self.progress):
            batch = {k: v.to(dev) for k, v in collate(chunk, self.pad_id).items()}
            f, r = collect_features(self.model, batch)
            feats += f
            residual = r if residual is None else residual
        return feats, residual

    def _loss(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
        if self.cfg.precompute:
            feats, residual = batch
            loss, mle, topic = head_losses(_unwrap(model), feats, residual)
            return loss, {"mle": mle.item(), "topic": topic.item()}
        out = model(**batch)
        parts = {"mle": (out.mle_loss if self.cfg.focus else out.loss).item()}
        if self.cfg.focus:
            parts["topic"] = out.topic_loss.item()
        return out.loss, parts

    # ------------------------------------------------------------------ loop
    def train(self, *, resume: bool = True, restart: bool = False) -> dict[str, Any]:
        """Train through :func:`gencraft.training.fit` (resumable: a re-run continues from
        ``output_dir/checkpoint``; Ctrl-C saves and raises
        :class:`~gencraft.training.Interrupted`). Writes ``train_summary.json`` (with the
        processes and the global batch, as every trainer) and returns it."""
        cfg, started = self.cfg, time.perf_counter()
        if cfg.precompute:
            train_feats, residual = self._features(self.train_rows, "base states (train)")
            valid_feats = (
                self._features(self.valid_rows, "base states (valid)")[0] if self.valid_rows else []
            )
            train_items, valid_items = train_feats, valid_feats

            def collate_fn(items: list) -> Any:
                return items, residual

            self.model.base.eval()  # frozen base: no dropout in the features
        else:
            train_items, valid_items = self.train_rows, self.valid_rows
            pad = self.pad_id

            def collate_fn(items: list) -> Any:
                return collate(items, pad)

        settings = {
            "train_config": settings_of(cfg),
            "base": self.base_name_or_path,
            "train_examples": len(self.train_rows),
        }
        if self.data:  # another task in the same folder is a changed setting
            settings["data"] = self.data
        result = fit(
            self.model,
            self.optimizer,
            train_items,
            loss_fn=self._loss,
            config=cfg.fit,
            output_dir=self.out,
            valid=valid_items or None,
            collate_fn=collate_fn,
            evaluate_fn=self._validate if cfg.select_by == "rougeL" else None,
            save_fn=self._save,
            settings=settings,
            accelerator=self.accelerator,
            resume=resume,
            restart=restart,
            progress=self.progress,
        )
        self.history = result.history
        self.step, self.train_time = result.steps, result.train_time
        self.trained_examples = result.trained_examples
        return result.write_summary(self.out, started, train_time=result.train_time)

    def _validate(self, model: nn.Module, loader: Any) -> dict[str, float]:
        """The validation loss, plus ROUGE-L (F, %) of beam-searched summaries of the first
        ``select_docs`` validation documents (computed on the main process)."""
        from gencraft.focus.evaluate import summarize
        from gencraft.metrics import score_task

        metrics = mean_loss(self._loss, self.accelerator)(model, loader)
        docs = self.valid_examples[: self.cfg.select_docs]
        summaries = summarize(
            _unwrap(model),
            self.tok,
            [d.document for d in docs],
            num_beams=self.cfg.select_beams,
            max_source=self.cfg.max_source,
            max_new_tokens=self.cfg.max_target,
            batch_size=self.cfg.fit.batch_size,
            progress=False,
        )
        texts, refs = [s[0] for s in summaries], [d.summary for d in docs]
        metrics["rougeL"] = score_task("xsum", texts, refs, metrics=("rougeL",))["rougeL"]
        return metrics

    def _save(self, model: nn.Module, directory: Path) -> None:
        settings = {"train": settings_of(self.cfg), "base": self.base_name_or_path}
        if self.data:
            settings["data"] = self.data
        save_run(directory, model, self.tok, settings)

    def save(self, directory: Path) -> None:
        """Write the model, tokenizer and training settings to ``directory`` (replacing it)."""
        if self.accelerator.is_main_process:
            save_directory(lambda d: self._save(_unwrap(self.model), d), directory)


def _unwrap(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model)
