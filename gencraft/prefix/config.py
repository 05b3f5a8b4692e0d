"""DASP's settings: :class:`PrefixConfig` (the prefixes, their blocking and the attention
normaliser) and :class:`PrefixTrainConfig` (``gencraft prefix train``). Field names follow
peft's ``PrefixTuningConfig`` where peft has one (``num_virtual_tokens``,
``prefix_projection``, ``encoder_hidden_size``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gencraft.config import check, field_options, option, positive
from gencraft.errors import ConfigError
from gencraft.extras import require
from gencraft.training.config import FitConfig, fit_options

NORMALIZERS = ("softmax", "truncsa", "softsa", "sparsemax", "entmax15")
#: normalisers that are not in the DASP paper (labelled extensions)
EXTENSIONS = ("sparsemax", "entmax15")
SEGMENTERS = ("uniform", "sentence")
#: the paper's Table 3 split: layers 1-7 of 12 are "lower"
LOWER_FRACTION = 7 / 12

LayerSet = Literal["none", "all", "lower", "upper"] | list[int]


def lower_layer_count(num_layers: int, lower_layers: int | None = None) -> int:
    """How many of ``num_layers`` count as "lower": ``lower_layers`` if given, else the paper's
    7 of 12 scaled to the depth (rounded half up), at least 1 and at most L − 1 (when L > 1)."""
    if lower_layers is not None:
        if not 0 <= lower_layers <= num_layers:
            raise ConfigError(
                f"lower_layers must lie in [0, {num_layers}] for a {num_layers}-layer stack, "
                f"got {lower_layers}"
            )
        return lower_layers
    n = math.floor(LOWER_FRACTION * num_layers + 0.5)
    return max(1, min(n, num_layers - 1)) if num_layers > 1 else 1


def resolve_layers(spec: LayerSet, num_layers: int, lower_layers: int | None = None) -> list[int]:
    """The layer indices (0-based, within one stack) that ``spec`` names."""
    if isinstance(spec, str):
        n_low = lower_layer_count(num_layers, lower_layers)
        table = {
            "none": [],
            "all": list(range(num_layers)),
            "lower": list(range(n_low)),
            "upper": list(range(n_low, num_layers)),
        }
        if spec not in table:
            raise ConfigError(
                f"a layer set is 'none', 'all', 'lower', 'upper' or a list of indices, got {spec!r}"
            )
        return table[spec]
    bad = [i for i in spec if not -num_layers <= int(i) < num_layers]
    if bad:
        raise ConfigError(f"layer indices {bad} out of range for a {num_layers}-layer stack")
    return sorted({int(i) % num_layers for i in spec})


@dataclass
class PrefixConfig:
    """Prefix-tuning with DASP's structure (see the field help; docs/prefix.md).

    * dense prefix-tuning: the defaults;
    * UniBlock: ``encoder_segments`` (and/or ``decoder_segments``) > 1, ``blocked_layers="all"``;
    * HierBlock: the same with ``blocked_layers="lower"``;
    * TruncSA / SoftSA: ``normalizer="truncsa"|"softsa"`` (``sparse_layers="all"``); HTruncSA /
      HSoftSA: ``sparse_layers="lower"``; HierBlock+SoftSA: both.
    """

    num_virtual_tokens: int = option(10, "P, prefix key/value vectors per layer and stack")
    encoder_segments: int = option(
        1, "S of the input (decoder-only: the prompt tokens); UniBlock groups of prefixes"
    )
    decoder_segments: int = option(
        1, "S of the output tokens (decoder self-attention); the paper uses 1 or 2"
    )
    blocked_layers: str | tuple[int, ...] = option(
        "all",
        "layers where a segment sees only its own prefix group: 'all' (UniBlock), 'lower' "
        "(HierBlock), 'upper', 'none', or indices",
    )
    lower_layers: int | None = option(
        None, "how many layers are 'lower' (default: the paper's 7 of 12, scaled to the depth)"
    )
    normalizer: Literal["softmax", "truncsa", "softsa", "sparsemax", "entmax15"] = option(
        "softmax",
        "attention normaliser: softmax, truncsa (eq. 2), softsa (eqs. 3-4); sparsemax and "
        "entmax15 are extensions (not in the paper; need the entmax package)",
    )
    sparse_layers: str | tuple[int, ...] = option(
        "all", "layers whose attention uses the normaliser ('lower': HTruncSA/HSoftSA)"
    )
    sparse_stack: Literal["auto", "encoder", "decoder", "both"] = option(
        "auto",
        "stack(s) with the normaliser: auto = the encoder of an encoder-decoder (the paper), "
        "the only stack of a decoder-only model",
    )
    top_p: float = option(0.95, "TruncSA: nucleus mass of the key-importance distribution")
    trunc_renormalize: bool = option(
        True, "TruncSA: re-normalise the rows after zeroing keys (the paper does not say)"
    )
    tau: float = option(1.0, "SoftSA: Gumbel-softmax temperature τ (paper: 1.0, 0.1, 0.01)")
    softsa_eval_noise: bool = option(
        False, "SoftSA: keep the Gumbel noise at evaluation (default: softmax(log a / τ))"
    )
    prefix_projection: bool = option(
        False, "Li & Liang's MLP reparameterisation (peft: prefix_projection)"
    )
    encoder_hidden_size: int | None = option(
        None, "hidden size of that MLP (peft's name; default: the key/value width)"
    )
    encoder_prefix: bool = option(
        True, "encoder-decoders: prefixes in the encoder's self-attention"
    )
    cross_prefix: bool = option(
        False, "encoder-decoders: prefixes in the decoder's cross-attention too"
    )
    segmenter: Any = field(
        default="uniform",
        metadata={
            "help": "how tokens get segments: 'uniform' (contiguous, as equal as possible over "
            "non-pad tokens), 'sentence' (sentence boundaries), or a callable (Python API)"
        },
    )
    output_length: int | None = option(
        None,
        "generation: the expected output length L; generated token i is in output segment "
        "min(S-1, i*S // L) (default: set by training to the mean target length, else "
        "max_new_tokens)",
    )
    init: Literal["random", "tokens"] = option(
        "random",
        "prefix initialisation: N(0, 1) as peft, or the base's own keys/values of P "
        "vocabulary tokens (Li & Liang's real-word initialisation)",
    )
    init_seed: int = option(0, "seed of the prefix initialisation")

    def __post_init__(self) -> None:
        p = self.num_virtual_tokens
        check(isinstance(p, int) and p >= 1, f"num_virtual_tokens must be >= 1, got {p}")
        for name in ("encoder_segments", "decoder_segments"):
            s = getattr(self, name)
            check(isinstance(s, int) and s >= 1, f"{name} must be >= 1, got {s}")
            check(
                s <= p,
                f"{p} prefixes cannot be split into {name}={s} groups (each needs at least one "
                "prefix): raise num_virtual_tokens or lower the segments",
            )
        check(
            self.normalizer in NORMALIZERS,
            f"normalizer must be one of {', '.join(NORMALIZERS)}, got {self.normalizer!r}",
        )
        check(0.0 < self.top_p <= 1.0, f"top_p must lie in (0, 1], got {self.top_p}")
        check(self.tau > 0, f"tau must be > 0, got {self.tau}")
        check(
            self.sparse_stack in ("auto", "encoder", "decoder", "both"),
            f"sparse_stack must be auto, encoder, decoder or both, got {self.sparse_stack!r}",
        )
        check(
            self.init in ("random", "tokens"), f"init must be random or tokens, got {self.init!r}"
        )
        for name in ("blocked_layers", "sparse_layers"):
            v = getattr(self, name)
            if isinstance(v, str) and v.replace(",", "").replace("-", "").strip().isdigit():
                v = [int(i) for i in v.split(",") if i.strip()]  # "0,1,2" from the CLI
            if isinstance(v, str):
                check(
                    v in ("none", "all", "lower", "upper"),
                    f"{name} must be none, all, lower, upper or a list of indices, got {v!r}",
                )
            else:
                check(
                    isinstance(v, Sequence) and all(isinstance(i, int) for i in v),
                    f"{name} must be none, all, lower, upper or a list of indices, got {v!r}",
                )
                setattr(self, name, [int(i) for i in v])
        if isinstance(self.segmenter, str):
            check(
                self.segmenter in SEGMENTERS,
                f"segmenter must be 'uniform', 'sentence' or a callable, got {self.segmenter!r}",
            )
        else:
            check(callable(self.segmenter), "segmenter must be 'uniform', 'sentence' or callable")
        check(
            self.output_length is None or self.output_length >= 1,
            f"output_length must be >= 1, got {self.output_length}",
        )
        check(
            self.encoder_hidden_size is None or self.encoder_hidden_size >= 1,
            f"encoder_hidden_size must be >= 1, got {self.encoder_hidden_size}",
        )
        if self.normalizer in EXTENSIONS:
            require_entmax()

    def sparse_stacks(self, is_encoder_decoder: bool) -> set[str]:
        """The stacks whose self-attention takes the normaliser: ``sparse_stack`` for an
        encoder-decoder ("auto": the encoder, as the paper); a decoder-only model's one stack
        (it reads the input and writes the output) whatever the setting."""
        if not is_encoder_decoder:
            return {"decoder"}
        return {
            "auto": {"encoder"},
            "encoder": {"encoder"},
            "decoder": {"decoder"},
            "both": {"encoder", "decoder"},
        }[self.sparse_stack]

    @property
    def blocking(self) -> bool:
        """Whether any segmenting applies (more than one group somewhere)."""
        return self.encoder_segments > 1 or self.decoder_segments > 1

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready settings (a callable segmenter is recorded as ``"callable"``)."""
        from dataclasses import asdict

        d = asdict(self)
        if callable(d["segmenter"]):
            d["segmenter"] = "callable"
        return d


def require_entmax() -> Any:
    """The ``entmax`` module, or a clear error with the pip command."""
    return require("entmax", "sparse", "the sparsemax and entmax15 normalisers")


TASKS = ("e2e", "dart", "xsum")
PAPER_LR = 5e-5  # the paper's (BART-large, probably with the MLP)
PREFIX_LR = 5e-3  # prefixes without the MLP (docs/prefix.md)


@dataclass
class PrefixTrainConfig:
    """``gencraft prefix train``: what to train on and how (the prefix settings are the
    :class:`PrefixConfig` flags); ``fit.seed`` seeds the shuffle, the prefix draws and
    SoftSA's noise."""

    model: str = option("smollm2-135m", "base model (registered name or local path)")
    task: str = option(
        "e2e",
        "dataset: e2e, dart (dev split), xsum, or your own data as a path (a .jsonl, .csv or "
        ".tsv file, or a folder of train/valid/test files: docs/datasets.md)",
    )
    source_field: str
    target_field: str
    source_field, target_field = field_options()
    method: Literal["prefix", "peft", "finetune"] = option(
        "prefix",
        "prefix-tuning (base frozen), the same through peft's PrefixTuning (same start), or "
        "full fine-tuning (all weights)",
    )
    lr: float | None = option(
        None,
        "AdamW learning rate (default: 5e-3 for prefixes without the MLP, as docs/prefix.md "
        "found; 5e-5, the paper's value for BART-large, with --prefix-projection or for "
        "--method finetune)",
    )
    train_examples: int | None = option(None, "use the first N training pairs (after shuffle)")
    valid_examples: int = option(200, "validation pairs for the loss")
    max_source_tokens: int = option(256, "source tokens kept (summaries: the document's head)")
    max_target_tokens: int = option(64, "target tokens kept")
    # the paper: 10 epochs for E2E/DART, batch 16 (8 for summarisation)
    fit: FitConfig = fit_options(epochs=10, batch_size=16)

    def __post_init__(self) -> None:
        from gencraft.data.own import own_task  # on use: the CLI's startup loads no data

        self.task = own_task(self.task, TASKS)
        check(
            self.method in ("prefix", "peft", "finetune"),
            f"method: prefix, peft or finetune, not {self.method}",
        )
        check(self.lr is None or self.lr > 0, f"lr must be > 0, got {self.lr}")
        positive(self, "max_source_tokens", "max_target_tokens")

    def learning_rate(self, prefix: PrefixConfig) -> float:
        """``lr``, else the default for this parameterisation: prefixes trained directly need
        a rate 100 times the paper's (docs/prefix.md: at 5e-5 tiny-llama's loss moved from
        5.5780 to 5.5777 in 400 steps); the MLP reparameterisation and full fine-tuning keep
        the paper's 5e-5."""
        if self.lr is not None:
            return self.lr
        direct = self.method != "finetune" and not prefix.prefix_projection
        return PREFIX_LR if direct else PAPER_LR
