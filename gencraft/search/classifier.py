"""Attribute classifiers for conditional beam search (Yoshida 2023, §7.4.3, Appendix E).

P_clf(A(x) = a | x_{1:t}, x_{t+1} = w) is read off the *frozen* NLG model's hidden states, so
candidates are scored without extra forward passes of the LM:

    h_stacked[t] = concat of all decoder layers' states at t (embeddings first)   [(M+1) * H]
    h_in[t]      = Linear(h_stacked[t])                                           [d_clf]
    h_out[t]     = Linear(causal Transformer(h_in[1:t])[t])                       [d_out]
    logits       = MLP(concat(h_out[t], E[w]))                                    [|A|]

with E the NLG model's input-embedding table (bound at run time, not stored in the
checkpoint). Defaults are the thesis's: 2 layers, d_clf = 240, 12 heads, d_out = 24, dropout
0.33, MLP 2 x 48 ReLU; Adam lr 1e-3, weight decay 3e-8, batch 8.

Positions: the classifier sees the hidden states from the last prompt position (which predicts
the first generated token) onward; the prompt itself enters only through those states.

Attributes:
  * remaining length in the thesis's 24 buckets (``length_bucket``): after x_{t+1}, how many
    tokens are still to come, EOS included (0 = x_{t+1} is EOS);
  * "degenerate" (binary, ``degenerate``): empty, repeats the prompt, unfinished, loops; the
    rules can be replaced by any ``(text, prompt, finished) -> bool``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from gencraft.errors import GencraftError, ModelLoadError
from gencraft.models.method import MethodModel
from gencraft.search.config import NUM_LENGTH_BUCKETS as NUM_LENGTH_BUCKETS
from gencraft.search.config import ClassifierConfig

CONFIG_NAME = "classifier_config.json"
WEIGHTS_NAME = "classifier.safetensors"


def length_bucket(remaining: int) -> int:
    """Class of a remaining length: 0-16 one class each (0-16), 17-32 in 4 groups of 4
    (17-20), 33-64 in 2 groups of 16 (21-22), 65 and more (23)."""
    if remaining < 0:
        raise GencraftError(f"remaining length must be >= 0, got {remaining}")
    if remaining <= 16:
        return remaining
    if remaining <= 32:
        return 17 + (remaining - 17) // 4
    if remaining <= 64:
        return 21 + (remaining - 33) // 16
    return 23


def length_labels(n_generated: int, finished: bool, censored: bool = False) -> list[int]:
    """Per-position remaining-length classes for one sample of ``n_generated`` tokens (EOS
    included if ``finished``); position t's class is about the sequence after token t + 1.

    An unfinished sample (cut at the maximum) has no known final length. By default its labels
    are -100 (ignored). With ``censored=True`` they are lower bounds instead: after token t + 1
    at least ``n_generated - t`` tokens (EOS included) remain, so the class is at least
    ``length_bucket(n_generated - t)``; train on them with the censored loss (the sample's
    ``censored`` flag), -log P(class >= label)."""
    if finished:
        return [length_bucket(n_generated - (t + 1)) for t in range(n_generated)]
    if censored:
        return [length_bucket(n_generated - t) for t in range(n_generated)]
    return [-100] * n_generated


def censored_nll(
    logits: torch.Tensor, labels: torch.Tensor, censored: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position negative log-likelihood of ``labels`` [...] under ``logits`` [..., C]:
    -log p[label] where ``censored`` [...] is False, -log sum_{c >= label} p[c] where it is
    True (the label is a lower bound); positions labelled -100 are ignored. Returns the summed
    loss and the number of positions counted."""
    keep = labels != -100
    y = labels.clamp(min=0)[..., None]
    classes = torch.arange(logits.shape[-1], device=logits.device)
    allowed = torch.where(censored[..., None], classes >= y, classes == y)
    logp = torch.log_softmax(logits.float(), dim=-1)
    nll = -torch.logsumexp(logp.masked_fill(~allowed, float("-inf")), dim=-1)
    return nll[keep].sum(), keep.sum()


def _repeats_ngram(words: list[str], n: int = 4, times: int = 3) -> bool:
    counts: dict[tuple[str, ...], int] = {}
    for i in range(len(words) - n + 1):
        g = tuple(words[i : i + n])
        counts[g] = counts.get(g, 0) + 1
        if counts[g] >= times:
            return True
    return False


def degenerate(text: str, prompt: str, finished: bool) -> bool:
    """The default "degenerate output" rules: empty; a copy of (a 12-word span of) the prompt;
    unfinished (cut at the length limit); or a loop (some 4-gram three times)."""
    words = text.split()
    if not words:
        return True
    if not finished:
        return True
    if _repeats_ngram([w.lower() for w in words]):
        return True
    p = " ".join(prompt.lower().split())
    span = 12
    if len(words) >= span:
        low = [w.lower() for w in words]
        return any(" ".join(low[i : i + span]) in p for i in range(len(low) - span + 1))
    return " ".join(w.lower() for w in words) in p and len(words) >= 3


def state_dims(model: nn.Module) -> tuple[int | None, int | None, int]:
    """What a classifier reads from ``model``: (decoder layers + 1 (embeddings first) or None,
    hidden size or None, input-embedding width)."""
    from gencraft.errors import GencraftError
    from gencraft.models.introspect import hf_model, model_shape

    model = hf_model(model)
    try:
        shape = model_shape(model)
        layers, hidden = shape.layers, shape.hidden
    except GencraftError:  # sizes the config does not name
        layers = hidden = None
    return (layers + 1 if layers else None), hidden, model.get_input_embeddings().weight.shape[1]


class AttributeClassifier(MethodModel):
    """The §7.4.3 classifier. ``forward(hidden, next_tokens)``: ``hidden`` [B, T, M+1, H] the
    NLG model's states at positions 0..T-1, ``next_tokens`` [B, T] the token at each next
    position; returns logits [B, T, num_classes]. Bind the NLG model's input embeddings with
    ``bind(model)`` before use. Disabled (:meth:`disable`), beam search ignores it.

    It reads a model's states but wraps none: :meth:`remove` has no base to give back."""

    method = "search"
    legacy_files = (CONFIG_NAME, WEIGHTS_NAME)

    def __init__(self, config: ClassifierConfig) -> None:
        super().__init__()
        c = self.config = config
        if c.d_clf % c.num_heads:
            raise GencraftError(f"d_clf={c.d_clf} must be divisible by num_heads={c.num_heads}")
        self.in_proj = nn.Linear(c.num_layers * c.hidden_size, c.d_clf)
        layer = nn.TransformerEncoderLayer(
            c.d_clf, c.num_heads, 4 * c.d_clf, c.dropout, batch_first=True, norm_first=True
        )
        self.transformer = nn.TransformerEncoder(
            layer, c.transformer_layers, enable_nested_tensor=False
        )
        self.out_proj = nn.Linear(c.d_clf, c.d_out)
        self.mlp = nn.Sequential(
            nn.Linear(c.d_out + c.embed_size, c.mlp_hidden),
            nn.ReLU(),
            nn.Linear(c.mlp_hidden, c.mlp_hidden),
            nn.ReLU(),
            nn.Linear(c.mlp_hidden, c.num_classes),
        )
        self._embedding: list[nn.Embedding] = []  # not a submodule: not saved, not trained
        self.target_class: Any = 0

    # the AttributeScorer protocol reads these
    @property
    def num_layers(self) -> int:
        return self.config.num_layers

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    def bind(self, model: nn.Module) -> AttributeClassifier:
        """Use ``model``'s input embeddings for candidate tokens; checks that ``model`` is the
        one it was trained on (its recorded name, when both are known) and the sizes match."""
        want = (self.config.num_layers, self.config.hidden_size, self.config.embed_size)
        got = state_dims(model)
        if want != got:
            raise GencraftError(
                f"this classifier was trained for a model with {want[0]} hidden-state layers of "
                f"size {want[1]} (embeddings {want[2]}), not {got[0]} x {got[1]} ({got[2]}): it "
                "was trained for another model"
            )
        import shlex

        from gencraft.models.introspect import fingerprint, hf_model, model_name, same_model_name

        trained, given = self.config.model_name, model_name(model)
        recorded = self.config.model_fingerprint
        if recorded is not None:  # the model itself, wherever its folder lies
            same = recorded == fingerprint(model)
        else:  # a classifier saved before fingerprints: by name, paths resolved
            names = (given, getattr(hf_model(model).config, "_name_or_path", None))
            same = not trained or not given or any(same_model_name(trained, n) for n in names)
        if not same:
            raise GencraftError(
                f"this classifier was trained on the hidden states of {trained!r}, not of "
                f"{given!r}: train one for it (gencraft search train-classifier --model "
                f"{shlex.quote(str(given))})"
            )
        self._embedding = [model.get_input_embeddings()]
        return self

    def _context(self, h_in: torch.Tensor, pad_mask: torch.Tensor | None = None) -> torch.Tensor:
        t = h_in.shape[1]
        causal = torch.triu(torch.ones(t, t, dtype=torch.bool, device=h_in.device), 1)
        out = self.transformer(h_in, mask=causal, src_key_padding_mask=pad_mask)
        return self.out_proj(out)

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        if not self._embedding:
            raise GencraftError(
                "call classifier.bind(model) first (it reads the model's input embeddings)"
            )
        with torch.no_grad():
            return self._embedding[0](tokens).to(self.in_proj.weight.dtype)

    def forward(
        self, hidden: torch.Tensor, next_tokens: torch.Tensor, pad_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        b, t, m, h = hidden.shape
        if (m, h) != (self.config.num_layers, self.config.hidden_size):
            raise GencraftError(
                f"hidden states are {m} x {h}, the classifier reads "
                f"{self.config.num_layers} x {self.config.hidden_size}"
            )
        # the classifier runs in its own dtype, whatever the base model's
        x = hidden.reshape(b, t, m * h).to(self.in_proj.weight.dtype)
        ctx = self._context(self.in_proj(x), pad_mask)
        return self.mlp(torch.cat([ctx, self._embed(next_tokens)], dim=-1))

    # -- AttributeScorer: incremental use inside beam search --------------------------------
    def init(self, n: int) -> dict[str, Any]:
        dev = self.in_proj.weight.device
        dtype = self.in_proj.weight.dtype
        return {"h_in": torch.zeros(n, 0, self.config.d_clf, device=dev, dtype=dtype), "t": 0}

    def score(
        self, state: dict[str, Any], hidden: torch.Tensor, candidates: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """log P(target class | x_{1:t}, candidate) [N, k]; the state gains position t."""
        n, m, h = hidden.shape
        with torch.no_grad():
            new = self.in_proj(hidden.reshape(n, 1, m * h).float().to(self.in_proj.weight))
            h_in = torch.cat([state["h_in"], new], dim=1)
            ctx = self._context(h_in)[:, -1]  # [N, d_out]
            emb = self._embed(candidates.to(self.in_proj.weight.device))  # [N, k, E]
            x = torch.cat([ctx[:, None].expand(-1, emb.shape[1], -1), emb], dim=-1)
            logp = torch.log_softmax(self.mlp(x).float(), dim=-1)  # [N, k, C]
        t = state["t"]
        cls = self.target_class(t) if callable(self.target_class) else self.target_class
        return logp[..., cls], {"h_in": h_in, "t": t + 1}

    def reorder(self, state: dict[str, Any], index: torch.Tensor) -> dict[str, Any]:
        return {"h_in": state["h_in"][index.to(state["h_in"].device)], "t": state["t"]}

    def for_length(self, n: int, *, includes_eos: bool = False) -> AttributeClassifier:
        """Target "the output has exactly n tokens before EOS": at step t the class of the
        remaining length n + 1 - (t + 1) (EOS included). ``includes_eos``: n counts the EOS
        (the thesis's tables' convention), i.e. n - 1 tokens before it."""
        if self.config.attribute != "length":
            raise GencraftError(
                f"for_length needs a length classifier, this one predicts {self.config.attribute!r}"
            )
        if includes_eos:
            n -= 1
        if n < 0:
            raise GencraftError(f"for_length needs n >= 0 tokens before EOS, got {n}")
        self.target_class = lambda t: length_bucket(max(n - t, 0))
        return self

    # -- the method contract ------------------------------------------------------------------
    # the NLG model's embeddings are bound at load time, never stored
    @property
    def method_config(self) -> ClassifierConfig:
        return self.config

    def method_state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.state_dict())

    @classmethod
    def base_task(cls, payload: dict[str, Any]) -> None:
        return None

    def _set_enabled(self, on: bool) -> None:
        pass  # beam_search reads self.enabled

    @classmethod
    def from_method_payload(
        cls, payload: dict[str, Any], tensors: dict[str, torch.Tensor], base: Any, **kwargs: Any
    ) -> AttributeClassifier:
        saved = payload.get("config", payload)  # pre-format saves hold the settings at the top
        clf = cls(ClassifierConfig(**saved))
        missing, unexpected = clf.load_state_dict(tensors, strict=False)
        if missing or unexpected:
            raise GencraftError(
                f"the saved weights do not match their config: missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}"
            )
        clf.eval()
        return clf.bind(base) if base is not None else clf

    @classmethod
    def from_pretrained(
        cls, path: str | Path, model: nn.Module | None = None, **kwargs: Any
    ) -> AttributeClassifier:
        """A saved classifier, bound to ``model`` (the NLG model it reads) when given."""
        try:
            return super().from_pretrained(path, model)
        except GencraftError as err:
            raise ModelLoadError(str(err)) from None
