"""Settings of the §7.4.3 attribute classifiers (:class:`ClassifierConfig`) and of their
training (:class:`ClassifierTrainConfig`, the flags of ``gencraft search train-classifier``).
Defaults are the thesis's (Appendix E)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gencraft.config import check, option
from gencraft.training.config import FitConfig, fit_options

NUM_LENGTH_BUCKETS = 24


@dataclass
class ClassifierConfig:
    """``num_layers`` x ``hidden_size``: the NLG model's stacked states (M + 1 layers incl.
    embeddings); ``embed_size``: its input-embedding width; ``num_classes``: |A|."""

    num_layers: int
    hidden_size: int
    embed_size: int
    num_classes: int = option(NUM_LENGTH_BUCKETS, "classes |A| (length: 24 buckets)")
    attribute: str = option("length", "length or degenerate")
    d_clf: int = option(240, "width of the classifier's transformer")
    num_heads: int = option(12, "its attention heads")
    transformer_layers: int = option(2, "its layers")
    d_out: int = option(24, "width of its output projection")
    dropout: float = option(0.33, "dropout")
    mlp_hidden: int = option(48, "width of the 2-layer MLP")
    model_name: str | None = option(None, "the NLG model it reads")
    model_fingerprint: str | None = option(
        None, "its config and first embedding rows, hashed (models.introspect.fingerprint)"
    )

    def __post_init__(self) -> None:
        check(self.num_classes >= 2, f"num_classes must be >= 2, got {self.num_classes}")
        check(
            self.d_clf % self.num_heads == 0,
            f"d_clf ({self.d_clf}) must be divisible by num_heads ({self.num_heads})",
        )


@dataclass
class ClassifierTrainConfig:
    """Thesis Appendix E: Adam lr 1e-3, weight decay 3e-8, batch 8 (epochs: 3 MT, 8 ROC)."""

    attribute: Literal["length", "degenerate"] = option(
        "length", "remaining length (24 buckets) or degenerate output (binary)"
    )
    lr: float = option(1e-3, "Adam learning rate")
    weight_decay: float = option(3e-8, "Adam weight decay")
    valid_fraction: float = option(0.1, "samples held out for validation")
    # thesis: batch 8, 8 epochs on ROC (3 on MT); no clipping, a constant learning rate
    fit: FitConfig = fit_options(epochs=8, batch_size=8, clip=None, decay="constant")

    def __post_init__(self) -> None:
        check(self.lr > 0, f"lr must be > 0, got {self.lr}")
        check(
            0 < self.valid_fraction < 1,
            f"valid_fraction must lie in (0, 1), got {self.valid_fraction}",
        )


@dataclass
class SearchDecodeConfig:
    """``gencraft search beam|mode``: how to search (beam size and length limit are the shared
    decode options)."""

    raw: bool = option(False, "no chat template: the prompt as is")
    length_includes_eos: bool = option(
        False,
        "lengths (--force-length, --length, --attribute N) count the EOS, as the thesis's "
        "tables do (default: tokens before EOS)",
    )
    finished: Literal["aside", "on_beam"] | None = option(
        None,
        "completed hypotheses (default: aside; on_beam, the thesis's Alg. 1, with --classifier)",
    )
    force_length: int | None = option(None, "exactly N tokens before EOS")
    classifier: str | None = option(
        None,
        "a classifier trained by `search train-classifier` (its output folder): conditional "
        "beam search",
    )
    attribute: str | None = option(
        None, "the classifier's target: N tokens (length) or not-degenerate (default)"
    )
    k: int = option(100, "candidates scored per beam")
    forced_eos: Literal["model", "free"] = option(
        "model",
        "the forced EOS (forced length; on the beam, at --max-new-tokens) scores the model's "
        "log P(EOS), or 0 (Alg. 1)",
    )
    forced_ranking: Literal["score", "selection"] = option(
        "score",
        "with --force-length on the beam: rank by the model score, or by the selection score "
        "C' (what Alg. 1 returns)",
    )
    length: int | None = option(None, "mode search: the best output of exactly N tokens")
    max_nodes: int | None = option(None, "mode search: stop after this many expanded nodes")


@dataclass
class ClassifierDataConfig:
    """The samples ``gencraft search train-classifier`` trains on."""

    prompts: Literal["xsum", "e2e", "both"] = option(
        "both", "instruction prompts built from these training splits"
    )
    prompt_file: str | None = option(
        None, "your own prompts instead: a text file, one prompt per line"
    )
    task: str | None = option(
        None,
        "your own prompts instead: a task's training inputs (a named task, or a .jsonl/.csv/"
        ".tsv file or a folder; its --source-field)",
    )
    source_field: str = option("source", "with --task PATH: the field holding the prompt")
    num_prompts: int = option(200, "prompts sampled from (the first N)")
    samples_per_prompt: int = option(8, "samples per prompt (>= 1)")
    sample_batch: int = option(8, "prompts sampled together (x samples per prompt rows)")
    censored: bool = option(
        False,
        "length: train on the lower-bound labels of samples cut at --max-new-tokens instead of "
        "ignoring them",
    )
