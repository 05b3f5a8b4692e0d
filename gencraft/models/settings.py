"""Decoding settings of ``gencraft generate`` (a plain dataclass: the CLI builds its flags
from it without importing torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from gencraft.config import check_cad_alpha
from gencraft.errors import GencraftError


@dataclass
class GenerationSettings:
    """Decoding settings of ``gencraft generate`` (each field is a flag)."""

    max_new_tokens: int = field(default=64, metadata={"help": "tokens generated at most"})
    num_beams: int = field(default=1, metadata={"help": "beam size (1: greedy or sampling)"})
    do_sample: bool = field(default=False, metadata={"help": "sample instead of searching"})
    top_k: int | None = field(default=None, metadata={"help": "top-k sampling (with sampling)"})
    top_p: float | None = field(
        default=None, metadata={"help": "nucleus sampling mass in (0, 1] (with sampling)"}
    )
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature (> 0)"})
    seed: int = field(
        default=0, metadata={"help": "sampling seed (the batch from prompt i on uses seed + i)"}
    )
    mbr: int = field(
        default=0,
        metadata={
            "help": "minimum Bayes risk decoding: draw N candidates per prompt (samples with "
            "--do-sample, else the N best beams) and output the one of the highest expected "
            "utility against the others (0: off)"
        },
    )
    mbr_utility: Literal["chrf", "bleu", "rouge", "bertscore"] = field(
        default="chrf", metadata={"help": "MBR's utility (sentence level)"}
    )
    epsilon: float | None = field(
        default=None,
        metadata={"help": "epsilon sampling cutoff in (0, 1) for --mbr's samples"},
    )
    cad_alpha: float | None = field(
        default=None,
        metadata={
            "help": "context-aware decoding (CAD): greedy or beam search on (1 + A)·log "
            "p(y | context, prompt) - A·log p(y | prompt); the context comes from --context "
            "(an encoder-decoder's context-free stream is an empty source without it)"
        },
    )
    chat: Literal["auto", "on", "off"] = field(
        default="auto",
        metadata={"help": "wrap prompts in the tokenizer's chat template (auto: when it has one)"},
    )

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise GencraftError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.num_beams < 1:
            raise GencraftError(f"num_beams must be >= 1, got {self.num_beams}")
        if self.top_k is not None and self.top_k < 1:
            raise GencraftError(f"top_k must be >= 1, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise GencraftError(f"top_p must lie in (0, 1], got {self.top_p}")
        if not self.temperature > 0:
            raise GencraftError(f"temperature must be > 0, got {self.temperature}")
        if not self.do_sample and (self.top_k is not None or self.top_p is not None):
            raise GencraftError("--top-k/--top-p only apply with --do-sample")
        if self.mbr < 0 or self.mbr == 1:
            raise GencraftError(
                f"--mbr takes 0 (off) or N >= 2 candidates to choose among, got {self.mbr}"
            )
        if self.epsilon is not None and not (self.mbr and self.do_sample):
            raise GencraftError("--epsilon applies to --mbr's samples: give --mbr N --do-sample")
        if self.epsilon is not None and not 0 < self.epsilon < 1:
            raise GencraftError(f"epsilon must lie in (0, 1), got {self.epsilon}")
        check_cad_alpha(self.cad_alpha)
        clash = [f for f, on in (("--do-sample", self.do_sample), ("--mbr", self.mbr)) if on]
        if self.cad_alpha is not None and clash:
            raise GencraftError(
                f"--cad-alpha decodes greedily or with beam search; it does not combine with "
                f"{' and '.join(clash)}"
            )

    def generate_kwargs(self) -> dict:
        kw: dict = {
            "max_new_tokens": self.max_new_tokens,
            "num_beams": self.num_beams,
            "do_sample": self.do_sample,
        }
        if self.do_sample:
            kw.update(top_k=self.top_k, top_p=self.top_p, temperature=self.temperature)
        return kw
