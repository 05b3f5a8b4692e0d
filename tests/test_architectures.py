"""The architecture matrix: every method on tiny random models of many ``transformers``
families (``gencraft.models.architectures``). Each cell either passes or is refused at
construction with a :class:`GencraftError` naming the architecture and saying it is not
supported. A pass means: enabled, the method changes the output; disabled, it equals the base
bit for bit; gradients reach the method's parameters; generation agrees with the method's own
forward (beam-search scores are its log-probabilities; greedy decoding its argmax).

``python tests/test_architectures.py`` prints the table of docs/architectures.md.
"""

from __future__ import annotations

import inspect
import sys
import warnings

import pytest
import torch
import transformers

from gencraft.errors import GencraftError
from gencraft.focus import FocusConfig, FocusForConditionalGeneration
from gencraft.hso import DynamicEvalConfig, HSOConfig, dynamic_eval_nll, hso_nll
from gencraft.metrics import windowed_nll
from gencraft.models.architectures import (
    ARCHITECTURES,
    DECODER_ONLY,
    ENCODER_DECODER,
    MASKED_LM,
    tiny_architecture,
)
from gencraft.nar.config import SamplingConfig
from gencraft.nar.decoding import sundae_generate
from gencraft.nar.model import mlm_to_seq2seq
from gencraft.pointer import PointerSentinelHead
from gencraft.prefix import PrefixConfig, PrefixModel
from gencraft.recurrence import RecurrenceConfig, RecurrentLM
from gencraft.search import beam_search

V = 16
PROMPT = [1, 5, 7, 9]

ATTENTION_METHODS = ("focus", "prefix", "recurrence")


def computes_attention_inline(arch: str) -> bool:
    """Whether the installed transformers' model file of ``arch`` computes attention without
    its attention-function registry (read from the file's source text; GPT-J did until 5.23,
    T5 and mT5 until 5.10 at least, Falcon and Bloom still do)."""
    _, model_name, _ = ARCHITECTURES[arch]
    model = getattr(transformers, model_name if arch != "bert2bert" else "BertModel")
    source = inspect.getsource(sys.modules[model.__module__])
    return "ALL_ATTENTION_FUNCTIONS" not in source


#: cells refused at construction, with a word of the reason the message must contain
REFUSED: dict[tuple[str, str], str] = {
    **{
        (m, a): "inline"
        for m in ATTENTION_METHODS
        for a in DECODER_ONLY
        if computes_attention_inline(a)
    },
    **{  # T5 and mT5 joined the registry after 5.5
        (m, a): "inline"
        for m in ("focus", "prefix")
        for a in ENCODER_DECODER
        if computes_attention_inline(a)
    },
    ("nar", "distilbert"): "decoder form",
    ("nar", "deberta-v2"): "decoder form",
    ("nar", "modernbert"): "decoder form",
}


def _ids(seed: int, n: int = 10) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.cat(
        [torch.tensor([PROMPT]), torch.randint(3, V, (1, n - len(PROMPT)), generator=g)], 1
    )


def _logp(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), -1)


def _grads_reach(params: list[torch.nn.Parameter]) -> None:
    assert params
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in params)
    assert any(p.grad.abs().sum() > 0 for p in params)


def _beam_agrees(model, outputs) -> None:
    """gencraft's beam search scores each hypothesis by the model's own forward."""
    hyps = beam_search(model, torch.tensor([PROMPT]), num_beams=2, max_new_tokens=3)
    assert hyps
    for h in hyps:
        seq = torch.tensor([PROMPT + h.tokens + ([h.eos_token] if h.finished else [])])
        lp = outputs(seq)[0].double()
        p = len(PROMPT)
        want = sum(lp[p - 1 + i, t].item() for i, t in enumerate(seq[0, p:].tolist()))
        assert h.score == pytest.approx(want, abs=1e-4)


# ----------------------------------------------------------------------------- decoder-only
def focus_cell(arch: str) -> None:
    base = tiny_architecture(arch, vocab_size=V, seed=0)
    model = FocusForConditionalGeneration(base, FocusConfig(freeze_base=True), frequent_ids=[3])
    with torch.no_grad():
        for p in model.head.parameters():
            p.normal_(0, 1.0)
    ids = _ids(0)
    src = (torch.arange(ids.shape[1]) < len(PROMPT))[None]

    def outputs(x):
        with torch.no_grad():
            s = (torch.arange(x.shape[1]) < len(PROMPT))[None]
            return _logp(model(input_ids=x, source_mask=s).logits)

    with torch.no_grad():
        ref = _logp(tiny_architecture(arch, vocab_size=V, seed=0)(ids).logits)
    on = outputs(ids)
    assert not torch.allclose(on, ref, atol=1e-3)
    with model.disable():
        assert torch.equal(outputs(ids), ref)
    model.train()
    model(input_ids=ids, labels=ids, source_mask=src).loss.backward()
    _grads_reach(list(model.head.parameters()))
    model.eval()
    _beam_agrees(model, outputs)


def pointer_cell(arch: str) -> None:
    base = tiny_architecture(arch, vocab_size=V, seed=0)
    head = PointerSentinelHead(base, window=4, base_name_or_path=arch)
    with torch.no_grad():
        head.query.weight.normal_(0, 1.0)
        head.sentinel.normal_(0, 1.0)
    head.eval()
    ids = _ids(1)

    def outputs(x):
        with torch.no_grad():
            return head(x, return_log_probs=True).log_probs

    with torch.no_grad():
        ref = _logp(tiny_architecture(arch, vocab_size=V, seed=0)(ids).logits)
    assert not torch.allclose(outputs(ids), ref, atol=1e-3)
    with head.disable():
        torch.testing.assert_close(outputs(ids), ref, atol=1e-6, rtol=0)
    head(ids).loss.backward()
    _grads_reach([head.query.weight, head.sentinel])
    _beam_agrees(head, outputs)


def prefix_cell(arch: str) -> None:
    base = tiny_architecture(arch, vocab_size=V, seed=0)
    model = PrefixModel(base, PrefixConfig(num_virtual_tokens=3, init_seed=0)).eval()
    ids = _ids(2)
    with torch.no_grad():
        ref = tiny_architecture(arch, vocab_size=V, seed=0)(ids).logits
        on = model(ids).logits
        assert not torch.allclose(on, ref, atol=1e-4)
        with model.disable():
            assert torch.equal(model(ids).logits, ref)
    model(ids, labels=ids).loss.backward()
    _grads_reach(list(model.prefix.parameters()))
    _greedy_agrees(model, torch.tensor([PROMPT]))


def _greedy_agrees(model, prompt: torch.Tensor, **kw) -> None:
    """Greedy generate() picks the argmax of the model's own forward at every step."""
    with torch.no_grad():
        out = model.generate(
            input_ids=prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=3,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            **kw,
        )
        seq = out if out.shape[1] > prompt.shape[1] else torch.cat([prompt, out], 1)
        logits = model(seq[:, :-1]).logits
    p = prompt.shape[1]
    assert seq[0, p:].tolist() == logits[0, p - 1 :].argmax(-1).tolist()


def recurrence_cell(arch: str) -> None:
    base = tiny_architecture(arch, vocab_size=V, seed=0)
    cfg = RecurrenceConfig(window=4, overlap=1, insert_layer=1, ffn_hidden=(8,), train_base=False)
    model = RecurrentLM(base, cfg)
    with torch.no_grad():
        for p in model.ffn.parameters():
            p.normal_(0, 1.0)
    model.eval()
    ids = _ids(3, n=12)
    ref = windowed_nll(tiny_architecture(arch, vocab_size=V, seed=0), ids, window=4, overlap=1)
    on = windowed_nll(model, ids, window=4, overlap=1)
    assert not torch.allclose(on, ref, atol=1e-4)
    with model.disable():
        assert torch.equal(windowed_nll(model, ids, window=4, overlap=1), ref)
    model(ids).loss.backward()
    _grads_reach([model.layer_logits, *model.ffn.parameters()])
    # a text scored in one window is the base's (no state yet): the windows' own forward
    with torch.no_grad():
        first = model(ids[:, :4]).logits[:, :3]
        torch.testing.assert_close(first, base(ids[:, :4]).logits[:, :3].float())


def search_cell(arch: str) -> None:
    base = tiny_architecture(arch, vocab_size=V, seed=0)

    def outputs(x):
        with torch.no_grad():
            return _logp(base(x).logits)

    _beam_agrees(base, outputs)


def hso_cell(arch: str) -> None:
    base = tiny_architecture(arch, vocab_size=V, seed=0)
    ids = _ids(4, n=14)[0]
    plain = hso_nll(base, ids, HSOConfig(window=4, lr=0.0)).token_nll
    with torch.no_grad():
        ref = -_logp(base(ids[None]).logits)[0, :-1].gather(1, ids[1:, None])[:, 0]
    torch.testing.assert_close(plain, ref, atol=1e-4, rtol=1e-4)
    moved = hso_nll(base, ids, HSOConfig(window=4, lr=0.5)).token_nll
    assert torch.isfinite(moved).all() and not torch.allclose(moved, plain, atol=1e-4)
    de = dynamic_eval_nll(base, ids, DynamicEvalConfig(window=4, lr=0.5)).token_nll
    assert torch.isfinite(de).all() and not torch.allclose(de, plain, atol=1e-4)


# ----------------------------------------------------------------------------- encoder-decoder
def _dec_inputs(model) -> tuple[torch.Tensor, torch.Tensor]:
    src = _ids(5, n=8)
    start = model.generation_config.decoder_start_token_id
    dec = torch.tensor([[start, 4, 6, 8, 10]])
    return src, dec


def focus_ed_cell(arch: str) -> None:
    base = tiny_architecture(arch, vocab_size=V, seed=0)
    model = FocusForConditionalGeneration(base, FocusConfig(freeze_base=True), frequent_ids=[3])
    with torch.no_grad():
        for p in model.head.parameters():
            p.normal_(0, 1.0)
    model.eval()
    src, dec = _dec_inputs(base)
    with torch.no_grad():
        ref = tiny_architecture(arch, vocab_size=V, seed=0)(
            input_ids=src, decoder_input_ids=dec
        ).logits
        on = model(input_ids=src, decoder_input_ids=dec).logits
        assert not torch.allclose(on, ref, atol=1e-3)
        with model.disable():
            assert torch.equal(model(input_ids=src, decoder_input_ids=dec).logits, ref)
    model.train()
    model(input_ids=src, labels=dec[:, 1:]).loss.backward()
    _grads_reach(list(model.head.parameters()))
    model.eval()

    def outputs(x):
        with torch.no_grad():
            return _logp(model(input_ids=src, decoder_input_ids=x).logits)

    hyps = beam_search(model, src, num_beams=2, max_new_tokens=3)
    start = base.generation_config.decoder_start_token_id
    for h in hyps:
        seq = torch.tensor([[start, *h.tokens, *([h.eos_token] if h.finished else [])]])
        lp = outputs(seq)[0].double()
        want = sum(lp[i, t].item() for i, t in enumerate(seq[0, 1:].tolist()))
        assert h.score == pytest.approx(want, abs=1e-4)


def prefix_ed_cell(arch: str) -> None:
    base = tiny_architecture(arch, vocab_size=V, seed=0)
    model = PrefixModel(base, PrefixConfig(num_virtual_tokens=3, init_seed=0)).eval()
    src, dec = _dec_inputs(base)
    with torch.no_grad():
        ref = tiny_architecture(arch, vocab_size=V, seed=0)(
            input_ids=src, decoder_input_ids=dec
        ).logits
        on = model(src, decoder_input_ids=dec).logits
        assert not torch.allclose(on, ref, atol=1e-4)
        with model.disable():
            assert torch.equal(model(src, decoder_input_ids=dec).logits, ref)
    model(src, labels=dec[:, 1:]).loss.backward()
    _grads_reach(list(model.prefix.parameters()))
    with torch.no_grad():
        out = model.generate(
            input_ids=src, max_new_tokens=3, do_sample=False, eos_token_id=None, num_beams=1
        )
        logits = model(src, decoder_input_ids=out[:, :-1]).logits
    assert out[0, 1:].tolist() == logits[0].argmax(-1).tolist()


def search_ed_cell(arch: str) -> None:
    base = tiny_architecture(arch, vocab_size=V, seed=0)
    src, _ = _dec_inputs(base)
    start = base.generation_config.decoder_start_token_id
    for h in beam_search(base, src, num_beams=2, max_new_tokens=3):
        seq = torch.tensor([[start, *h.tokens, *([h.eos_token] if h.finished else [])]])
        with torch.no_grad():
            lp = _logp(base(input_ids=src, decoder_input_ids=seq).logits)[0].double()
        want = sum(lp[i, t].item() for i, t in enumerate(seq[0, 1:].tolist()))
        assert h.score == pytest.approx(want, abs=1e-4)


# ----------------------------------------------------------------------------- masked LMs
def nar_cell(arch: str) -> None:
    mlm = tiny_architecture(arch, vocab_size=V, seed=0)
    model = mlm_to_seq2seq(mlm, seed=0, max_target_length=6).eval()
    # the decoder starts as the MLM: its body's weights are the masked LM's
    prefix = mlm.base_model_prefix
    body = getattr(mlm, prefix).state_dict()
    for k, v in getattr(model.decoder, prefix).state_dict().items():
        if k in body:
            assert torch.equal(v, body[k]), k
    src = _ids(6, n=7)
    hidden = model.encode(src).last_hidden_state
    tgt = torch.randint(3, V, (1, 5))
    logits = model.decode_logits(tgt, hidden)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten())
    loss = loss + torch.nn.functional.cross_entropy(model.length_logits(hidden), torch.tensor([5]))
    loss.backward()
    cross = [p for n, p in model.decoder.named_parameters() if "crossattention" in n]
    _grads_reach(cross)
    _grads_reach(list(model.length_head.parameters()))
    noise = torch.arange(3, V)
    out = sundae_generate(model, src, config=SamplingConfig(steps=3, samples=2), noise=noise)
    assert len(out.sequences) == 1


CELLS = {
    "decoder-only": (
        DECODER_ONLY,
        {
            "focus": focus_cell,
            "pointer": pointer_cell,
            "prefix": prefix_cell,
            "recurrence": recurrence_cell,
            "search": search_cell,
            "hso": hso_cell,
        },
    ),
    "encoder-decoder": (
        ENCODER_DECODER,
        {"focus": focus_ed_cell, "prefix": prefix_ed_cell, "search": search_ed_cell},
    ),
    "masked-lm": (MASKED_LM, {"nar": nar_cell}),
}
PARAMS = [
    pytest.param(method, arch, fn, id=f"{method}-{arch}")
    for _, (archs, methods) in CELLS.items()
    for method, fn in methods.items()
    for arch in archs
]


def run_cell(method: str, arch: str, fn) -> str:
    """'pass' or 'refused: <message>'; a refusal outside REFUSED, or any other error, raises."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            fn(arch)
        except GencraftError as err:
            if (method, arch) not in REFUSED:
                raise
            return f"refused: {err}"
    return "pass"


@pytest.mark.parametrize(("method", "arch", "fn"), PARAMS)
def test_cell_passes_or_is_refused_by_name(method, arch, fn):
    result = run_cell(method, arch, fn)
    if (method, arch) in REFUSED:
        assert result.startswith("refused"), f"{method} on {arch} was expected to be refused"
        msg = result.lower()
        model_cls = tiny_architecture(arch, vocab_size=V).__class__.__name__.lower()
        assert model_cls in msg and "not supported" in msg and REFUSED[(method, arch)] in msg
    else:
        assert result == "pass"


def table() -> str:
    """The supported-architectures table (markdown) from running every cell."""
    lines = []
    for group, (archs, methods) in CELLS.items():
        lines += [
            f"\n### {group}\n",
            "| architecture | " + " | ".join(methods) + " |",
            "|---|" + "---|" * len(methods),
        ]
        for arch in archs:
            row = []
            for method, fn in methods.items():
                try:
                    r = run_cell(method, arch, fn)
                except Exception as e:  # a failing cell shows in the table
                    r = f"FAIL {type(e).__name__}"
                row.append("yes" if r == "pass" else ("refused" if r.startswith("ref") else r))
            lines.append(f"| {arch} | " + " | ".join(row) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(table() + "\n")
