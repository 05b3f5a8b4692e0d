"""Context-aware decoding on prefix models (``prefix generate|eval --cad-alpha``), by paired
rows: both streams run through the prefix model's own ``generate``, each with the prefixes
and its own block tables. Greedy CAD equals a loop over the two streams decoded separately by
that same ``generate`` (each forced along the contrasted tokens so far); α = 0 leaves the
context rows as the plain decode; a row decodes in the batch as alone."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LogitsProcessor

from gencraft.models.cad import CADSettings, paired_contrast_generate
from gencraft.models.tiny import build_tiny_model
from gencraft.prefix import PrefixConfig, PrefixModel
from tests.search.test_batch import SETTINGS

EOS, PAD = 2, 0
VARIANTS = {
    "dense": {},
    "hierblock": {"encoder_segments": 2, "decoder_segments": 2, "blocked_layers": "lower"},
    "uniblock": {"encoder_segments": 2, "decoder_segments": 2, "blocked_layers": "all"},
}
SEQ2SEQ = ("tiny-t5", "tiny-bert2bert")  # tiny BART's random outputs ignore the input
_MODELS: dict = {}


def _model(name: str, variant: str) -> PrefixModel:
    if (name, variant) not in _MODELS:
        cfg = PrefixConfig(num_virtual_tokens=3, init_seed=1, output_length=4, **VARIANTS[variant])
        _MODELS[name, variant] = PrefixModel(build_tiny_model(name, seed=1), cfg).eval()
    return _MODELS[name, variant]


class _Forced(LogitsProcessor):
    """Keeps generate on ``tokens``, then records the next step's log-probabilities."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens, self.step, self.seen = tokens, 0, None

    def __call__(self, input_ids, scores):
        if self.step == len(self.tokens):
            self.seen = torch.log_softmax(scores[0].float(), -1)
        else:
            forced = torch.full_like(scores, -float("inf"))
            forced[:, self.tokens[self.step]] = 0.0
            scores = forced
        self.step += 1
        return scores


def _next_lp(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """[V]: the stream's log p(next | prompt, tokens) from the prefix model's own generate
    (its output-segment rule holds: output_length fixes L)."""
    record = _Forced(tokens)
    with torch.no_grad():
        model.generate(
            input_ids=torch.tensor([prompt]),
            max_new_tokens=len(tokens) + 1,
            logits_processor=[record],
            eos_token_id=EOS,
            pad_token_id=PAD,
            do_sample=False,
            min_new_tokens=len(tokens) + 1,
        )
    return record.seen


def _reference(model, ctx, plain, alpha, new) -> list[int]:
    out: list[int] = []
    for _ in range(new):
        a, b = _next_lp(model, ctx, out), _next_lp(model, plain, out)
        # a token the context-free stream rules out counts as log p = -1e4 there
        out.append(int(torch.log_softmax((1 + alpha) * a - alpha * b.clamp_min(-1e4), -1).argmax()))
        if out[-1] == EOS:
            break
    return out


def _batch(prompts: list[list[int]], left: bool):
    width = max(map(len, prompts))
    ids = [[PAD] * (width - len(p)) + p if left else p + [PAD] * (width - len(p)) for p in prompts]
    mask = [[int(t != PAD) for t in row] for row in ids]
    return torch.tensor(ids), torch.tensor(mask)


tokens = st.lists(st.integers(5, 250), min_size=2, max_size=7)


def _decode(model, name, rows, alpha, **kw):
    left = name not in SEQ2SEQ
    ctx, free = _batch([r[0] for r in rows], left), _batch([r[1] for r in rows], left)
    with torch.no_grad():
        return paired_contrast_generate(
            model.generate,
            *ctx,
            *free,
            cad=CADSettings(alpha),
            left_padding=left,
            pad_token_id=PAD,
            eos_token_id=EOS,
            do_sample=False,
            **kw,
        )


@settings(max_examples=8, **SETTINGS)
@given(
    name=st.sampled_from(["tiny-llama", *SEQ2SEQ]),
    variant=st.sampled_from(sorted(VARIANTS)),
    rows=st.lists(st.tuples(tokens, tokens), min_size=1, max_size=3),
    alpha=st.sampled_from([0.5, 1.0, 2.0]),
    new=st.integers(1, 5),
)
def test_greedy_prefix_cad_equals_the_two_streams_decoded_apart(name, variant, rows, alpha, new):
    model = _model(name, variant)
    out = _decode(model, name, rows, alpha, max_new_tokens=new, min_new_tokens=new)
    start = 1 if name in SEQ2SEQ else max(len(r[0]) for r in rows)
    for r, (ctx, plain) in enumerate(rows):
        want = _reference(model, ctx, plain, alpha, new)
        got = out[r, start:].tolist()
        assert got[: len(want)] == want and set(got[len(want) :]) <= {PAD}


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-t5"])
@pytest.mark.parametrize("variant", ["dense", "hierblock"])
def test_prefix_cad_beams_rows_alone_and_alpha_zero(name, variant):
    model = _model(name, variant)
    g = torch.Generator().manual_seed(3)
    draw = lambda n: torch.randint(5, 250, (n,), generator=g).tolist()  # noqa: E731
    rows = [(draw(n), draw(m)) for n, m in ((6, 2), (3, 4), (5, 1))]
    kw = dict(max_new_tokens=5, min_new_tokens=5, num_beams=3)
    together = _decode(model, name, rows, 4.0, **kw)
    for r in range(len(rows)):
        alone = _decode(model, name, rows[r : r + 1], 4.0, **kw)
        # a decoder-only batch's prompt is wider than the row's own
        assert together[r, together.shape[1] - alone.shape[1] :].tolist() == alone[0].tolist()
    plain = _batch([r[0] for r in rows], name not in SEQ2SEQ)
    with torch.no_grad():
        want = model.generate(*plain, eos_token_id=EOS, pad_token_id=PAD, **kw)
    assert _decode(model, name, rows, 0.0, **kw).tolist() == want.tolist()
    assert together.tolist() != want.tolist()  # the contrast changes what is decoded


def test_cli_eval_and_generate_take_cad_alpha(tmp_path, capsys, shared_data):
    """``prefix eval|generate --cad-alpha``: the context-free input is the separator alone
    (built here by hand), the outputs equal the paired decode of the loaded run."""
    import argparse
    import json

    from gencraft.cli.main import main
    from gencraft.cli.prefix import _load
    from gencraft.models.prompts import pad_batch
    from gencraft.prefix.data import SEPARATOR

    run, data = tmp_path / "run", ["--data-dir", str(shared_data)]
    train = ["prefix", "train", "--model", "tiny-llama", "--num-virtual-tokens", "3"]
    train += ["--encoder-segments", "2", "--batch-size", "4", "--train-examples", "8"]
    train += ["--valid-examples", "4", "--max-steps", "2", "--output", str(run), "--quiet"]
    assert main([*train, *data]) == 0
    common = ["--limit", "3", "--num-beams", "2", "--max-new-tokens", "6", "--quiet", *data]
    out = tmp_path / "cad.json"
    args = ["prefix", "eval", str(run / "best"), *common, "--json", "--output", str(out)]
    assert main([*args, "--cad-alpha", "10"]) == 0
    got = json.loads(out.read_text())
    assert got["cad_alpha"] == 10 and got["examples"] == 3
    model, tok, meta = _load(str(run / "best"), "eval", argparse.Namespace())
    from gencraft.data.tasks import source_of, task_examples

    sources = [source_of(e) for e in task_examples("e2e", "test", str(shared_data))[:3]]
    sep = tok(SEPARATOR, add_special_tokens=False)["input_ids"]
    cut = meta["train"]["max_source_tokens"]
    rows = [
        {"input_ids": tok(s, add_special_tokens=False)["input_ids"][:cut] + sep} for s in sources
    ]
    ctx, free = pad_batch(rows, PAD, left=True), pad_batch([{"input_ids": sep}] * 3, PAD, left=True)
    with torch.no_grad():
        seq = paired_contrast_generate(
            model.generate,
            ctx["input_ids"],
            ctx["attention_mask"],
            free["input_ids"],
            free["attention_mask"],
            cad=CADSettings(10.0),
            left_padding=True,
            pad_token_id=PAD,
            eos_token_id=EOS,
            max_new_tokens=6,
            num_beams=2,
        )
    new = seq[:, ctx["input_ids"].shape[1] :]
    want = [t.strip() for t in tok.batch_decode(new, skip_special_tokens=True)]
    assert got["outputs"] == want
    assert main([*args, "--restart"]) == 0  # without CAD (a random tiny model: alpha moves it)
    assert json.loads(out.read_text())["outputs"] != want
    capsys.readouterr()
    gen = ["prefix", "generate", str(run / "best"), "--source", sources[0], "--cad-alpha", "10"]
    assert main([*gen, "--num-beams", "2", "--max-new-tokens", "6", "--quiet", *data]) == 0
    assert json.loads(capsys.readouterr().out)["output"] == want[0]
    assert main([*args, "--cad-alpha", "-1", "--restart"]) == 2
    assert json.loads(out.read_text())["outputs"] != want  # a refused run keeps the file
    err = capsys.readouterr().err
    assert "--cad-alpha takes a finite weight A >= 0, got -1.0" in err and "Traceback" not in err
