"""``gencraft demo``: what gencraft is for, offline, in a few minutes on 2 CPU cores.

On SmolLM2-135M-Instruct and the local data, one step per landed method, each explained:

1. the model: perplexity on WikiText-2 test, greedy / beam / nucleus generation;
2. search (Yoshida ch. 6-7): beam search against the exact mode of the same model on an E2E
   prompt (often empty or cut short: the "bad mode" problem), and the length-conditional mode;
3. FAME (Aralikatte et al.): a focus head trained for about a minute on the frozen model,
   then beam search against focus_top,k summaries of XSum documents;
4. pointer sentinel (Merity et al.): a pointer head trained briefly on WikiText-2 over the
   frozen model, its perplexity beside the base's, and its gate on a passage (PNG).

Outputs (trained heads, the gate plot) go to ``--output`` (default ``outputs/demo``).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from gencraft.cli.evaluate import format_table
from gencraft.progress import tqdm

PROMPT = "Write a two-line poem about autumn leaves."
DECODERS = {
    "greedy": {"do_sample": False, "num_beams": 1},
    "beam-4": {"do_sample": False, "num_beams": 4, "early_stopping": True},
    "nucleus-0.9": {"do_sample": True, "top_p": 0.9, "top_k": 0},
}


def _section(title: str, why: str = "") -> None:
    print(f"\n=== {title} ===", flush=True)
    if why:
        print(why.strip(), flush=True)


def run_demo(
    data_dir: str | None = None,
    ppl_tokens: int = 4000,
    device: str | None = None,
    output: str = "outputs/demo",
    fame_seconds: float = 60.0,
    pointer_seconds: float = 45.0,
) -> dict:
    """Run the demo; returns its numbers (also printed)."""
    from gencraft.data import load_lm_corpus
    from gencraft.metrics import text_perplexity
    from gencraft.models import load_model
    from gencraft.models.generate import generate_text

    torch.manual_seed(0)
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    numbers: dict = {}
    t0 = time.time()
    _section("1. the model")
    model, tok = load_model("smollm2-135m", device=device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"SmolLM2-135M-Instruct ({n_params / 1e6:.1f}M parameters, GGUF Q4_1 dequantised)")
    corpus = load_lm_corpus("wikitext-2", data_dir, splits=("train", "valid", "test"))
    r = text_perplexity(model, tok, corpus.text("test", ppl_tokens))
    numbers["ppl"] = {"tokens": r["tokens"], "token_ppl": r["perplexity"]}
    numbers["ppl"]["word_ppl"] = math.exp(r["nll"] / ppl_tokens)
    print(format_table([{"WikiText-2 test words": ppl_tokens, **numbers["ppl"]}]))
    print(f"\n>>> {PROMPT}")
    for name, kw in DECODERS.items():
        print(f"[{name}] {generate_text(model, tok, [PROMPT], seed=0, max_new_tokens=40, **kw)[0]}")

    numbers["search"] = _search(model, tok, data_dir)
    numbers["fame"] = _fame(model, tok, data_dir, out / "fame", fame_seconds)
    numbers["pointer"] = _pointer(model, tok, corpus, out / "pointer", pointer_seconds)
    numbers["seconds"] = time.time() - t0
    print(f"\ndemo finished in {numbers['seconds']:.0f}s; outputs in {out}/")
    return numbers


def _search(model, tok, data_dir) -> dict:
    from gencraft.search import beam_search, exact_mode
    from gencraft.search.prompts import encode_prompt, instruction_texts

    _section(
        "2. beam search vs the exact mode (gencraft.search)",
        """
The most probable output of a language model is often not a good one. Beam search finds a
likely output; exact search (DFS with pruning) finds the most likely one it can within a node
budget. For an instruction model the best-scoring output is often empty or cut short. The
length-conditional mode (the best output of exactly n tokens) is a way around it.""",
    )
    text = instruction_texts("e2e", 1, data_dir)[0]
    ids = encode_prompt(tok, text)
    print(f">>> {text}")
    beam = beam_search(model, ids, num_beams=4, max_new_tokens=32)[0]
    mode = exact_mode(model, ids, max_new_tokens=32, max_nodes=120, initial=beam.tokens)
    n = max(1, len(beam.tokens))
    cond = exact_mode(
        model, ids, max_new_tokens=n, length=n, max_nodes=120, initial=beam.tokens[:n]
    )
    rows = [
        {"search": "beam 4", "log P": beam.score, "tokens": len(beam.tokens), "proven": "-"},
        {
            "search": "exact mode",
            "log P": mode.log_prob,
            "tokens": len(mode.tokens),
            "proven": mode.exact,
        },
        {
            "search": f"mode of length {n}",
            "log P": cond.log_prob,
            "tokens": len(cond.tokens),
            "proven": cond.exact,
        },
    ]
    print(format_table(rows))
    for label, toks in (
        ("beam 4", beam.tokens),
        ("exact mode", mode.tokens),
        (f"length {n}", cond.tokens),
    ):
        print(f"[{label}] {tok.decode(toks, skip_special_tokens=True)!r}")
    print(
        "(exact search starts from beam search's output as its bound; 'proven' means the whole "
        "tree was ruled out within 120 nodes)"
    )
    return {
        "beam_log_prob": beam.score,
        "mode_log_prob": mode.log_prob,
        "mode_tokens": len(mode.tokens),
        "mode_exact": mode.exact,
        "length": n,
        "length_mode_log_prob": cond.log_prob,
    }


def _fame(model, tok, data_dir, out: Path, seconds: float) -> dict:
    from gencraft.data import load_summarization
    from gencraft.focus.evaluate import summarize, summary_metrics
    from gencraft.focus.model import FocusForConditionalGeneration
    from gencraft.focus.train import FocusTrainConfig, FocusTrainer
    from gencraft.training import FitConfig

    _section(
        "3. FAME: focus attention and focus sampling (gencraft.focus)",
        f"""
A FAME head reads the document through the model's own attention and adds a topic bias f_t to
every next-token distribution (eq. 2); trained with the summary's words as topic targets, it
also gives T_X, the document's topic distribution, from which focus_top,k keeps the k most
on-topic words. Here the head trains for about {seconds:.0f} s on 24 XSum documents over the
frozen SmolLM2 (the base runs once per document).""",
    )
    train = load_summarization("xsum", "train", data_dir)[:24]
    valid = load_summarization("xsum", "validation", data_dir)[:4]
    test = load_summarization("xsum", "test", data_dir)[:2]
    cfg = FocusTrainConfig(
        freeze_base=True,
        lr=1e-3,
        fit=FitConfig(epochs=10, max_time=seconds, batch_size=4, warmup=0.1),
        max_source=256,
        max_target=48,
        frequent_size=500,
    )
    trainer = FocusTrainer(
        model, tok, train, valid, cfg, out, base_name_or_path="smollm2-135m", progress=True
    )
    result = trainer.train(restart=True)
    trainer.model.remove()  # reload the best head (lowest validation loss) on the same base
    fame = FocusForConditionalGeneration.from_pretrained(out / "best", base_model=model).eval()
    docs = [d.document for d in test]
    refs = [d.summary for d in test]
    common = dict(max_source=256, max_new_tokens=40, batch_size=2, progress=False)
    rows, texts = [], {}
    systems = (
        ("SmolLM2 alone, beam 4", model, "beam", {}),
        ("FAME, beam 4", fame, "beam", {}),
        ("FAME, focus_top k=1000", fame, "focus_top", {"focus_k": 1000}),
    )
    for name, system, decoding, kw in systems:
        if system is model:
            fame.enabled = False  # the bias off: the base's own distribution
        preds = [
            g[0]
            for g in summarize(
                fame if system is model else system, tok, docs, decoding=decoding, **common, **kw
            )
        ]
        fame.enabled = True
        texts[name] = preds
        m = summary_metrics(preds, refs, docs, with_bertscore=False)
        rows.append(
            {"decoding": name, "ROUGE-L": m["RL"], "R1 precision vs doc": m["R1_precision_doc"]}
        )
    print(format_table(rows))
    for i, d in enumerate(test):
        print(f"\n[{d.id}] reference: {d.summary}")
        for name, preds in texts.items():
            print(f"  {name}: {preds[i]}")
    fame.remove()  # the base goes on plain to the next step
    return {
        "steps": result["steps"],
        "train_seconds": result["train_time"],
        "valid_loss": result["best_valid_loss"],
        "rows": rows,
    }


def _pointer(model, tok, corpus, out: Path, seconds: float) -> dict:
    from gencraft.pointer import PointerSentinelHead
    from gencraft.pointer.analysis import head_passage_view, plot_passage
    from gencraft.training import FitConfig, fit

    _section(
        "4. pointer sentinel mixture (gencraft.pointer)",
        f"""
A pointer head mixes the model's softmax with a copy distribution over the last 100 tokens,
weighted by a learned gate g (eq. 6): rare words seen in context get copied. It trains for
about {seconds:.0f} s on WikiText-2 train over the frozen SmolLM2 (H^2 + 2H = 333,696 new
parameters), then both are scored on WikiText-2 valid.""",
    )
    torch.manual_seed(0)
    head = PointerSentinelHead(model, window=100, freeze_base=True)
    ids = tok(corpus.text("train", 30_000), return_tensors="pt")["input_ids"][0]
    chunks = [ids[i : i + 128] for i in range(0, ids.numel() - 128, 128)]
    valid_ids = tok(corpus.text("valid", 3_000), return_tensors="pt")["input_ids"][0]
    valid = [valid_ids[i : i + 256] for i in range(0, valid_ids.numel() - 256, 256)]

    def loss_fn(m, batch):  # batch: [B, 128] token ids (collate_fn=torch.stack)
        return m(batch).loss

    result = fit(
        head,
        torch.optim.Adam([p for p in head.parameters() if p.requires_grad], lr=1e-2),
        chunks,
        loss_fn=loss_fn,
        config=FitConfig(epochs=1, batch_size=4, max_time=seconds, clip=1.0, decay="constant"),
        output_dir=out,
        collate_fn=torch.stack,
        save_fn=lambda m, d: m.save_pretrained(d),
        restart=True,
        progress=True,
    )
    head.eval()
    nll_head = nll_base = count = 0.0
    with torch.no_grad():
        for chunk in tqdm(valid, desc="valid", leave=False):
            x = chunk[None]
            nll_head += float(head(x).nll.sum())
            lp = torch.log_softmax(model(x).logits[0, :-1].float(), -1)
            nll_base += float(-lp.gather(1, chunk[1:, None]).sum())
            count += chunk.numel() - 1
    ppl = {"base": math.exp(nll_base / count), "pointer head": math.exp(nll_head / count)}
    print(format_table([{"WikiText-2 valid tokens": int(count), **ppl}]))
    text = corpus.text("valid", 200)
    view = head_passage_view(head, tok, text, max_tokens=48)
    png = plot_passage(view, out / "gate.png", max_distance=48)
    copied = [
        (i, t, g)
        for i, t, g in zip(view.inputs, view.targets, view.gate.tolist(), strict=True)
        if g < 0.9
    ]
    print(f"gate and pointer attention on a passage: {png}")
    print(f"{len(copied)} of {len(view.targets)} predictions give the pointer more than 10%")
    return {"steps": result.steps, "ppl": ppl, "png": str(png)}
