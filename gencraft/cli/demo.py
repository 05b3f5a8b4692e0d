"""``gencraft demo``: every method of gencraft, offline, in about three minutes on 2 CPU cores.

On SmolLM2-135M-Instruct (MiniLM for the non-autoregressive step) and the local data, one
step per method. Each says in one sentence what the method is for and ends on output that
shows it at work; where a few seconds of training cannot show a gain, the step says so and
shows what the method does instead:

1. the model: perplexity on WikiText-2 test, greedy and nucleus generation;
2. search (Yoshida ch. 5-7): beam search against the exact mode and the length-conditional mode;
3. FAME (Aralikatte et al.): a focus head trained briefly; the document's topic words T_X;
4. pointer sentinel (Merity et al.): a pointer head trained briefly; where it points when a
   rare word repeats (PNG);
5. prefixes (DASP): per-segment prefixes trained briefly on E2E; the validation loss falls and
   the blocking mask shows which prefix each segment reads;
6. recurrence (Yoshida ch. 2): the cost of cutting a text into windows, and what carrying
   h_prev between them costs instead;
7. HSO (Yoshida ch. 3): a lower perplexity on a passage, the weights untouched;
8. RUM-SUNDAE (Yoshida ch. 4): a masked LM turned into a generator, its output beside the
   number of decoder calls it took.

Outputs (trained heads, plots) go to ``--output`` (default ``outputs/demo``).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch

from gencraft.cli.evaluate import format_table

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
    ppl_tokens: int = 2000,
    device: str | None = None,
    output: str = "outputs/demo",
    fame_seconds: float = 12.0,
    pointer_seconds: float = 10.0,
    prefix_seconds: float = 12.0,
    nar_seconds: float = 12.0,
) -> dict:
    """Run the demo; returns its numbers (also printed)."""
    from gencraft.data import load_lm_corpus
    from gencraft.models import load_model

    torch.manual_seed(0)
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    numbers: dict = {"step_seconds": {}}
    t0 = time.time()

    def timed(name: str, fn: Any) -> Any:
        start = time.time()
        result = fn()
        numbers["step_seconds"][name] = round(time.time() - start, 1)
        return result

    _section(
        "1. the model",
        "The model every step below starts from, and how it scores and writes without help.",
    )
    model, tok = load_model("smollm2-135m", device=device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"SmolLM2-135M-Instruct ({n_params / 1e6:.1f}M parameters, GGUF Q4_1 dequantised)")
    corpus = load_lm_corpus("wikitext-2", data_dir, splits=("train", "valid", "test"))

    numbers["ppl"] = timed("model", lambda: _base(model, tok, corpus, ppl_tokens))
    numbers["search"] = timed("search", lambda: _search(model, tok, data_dir))
    numbers["fame"] = timed("fame", lambda: _fame(model, tok, data_dir, out / "fame", fame_seconds))
    numbers["pointer"] = timed(
        "pointer", lambda: _pointer(model, tok, corpus, out / "pointer", pointer_seconds)
    )
    numbers["prefix"] = timed(
        "prefix", lambda: _prefix(data_dir, out / "prefix", prefix_seconds, device)
    )
    numbers["recurrence"] = timed("recurrence", lambda: _recurrence(model, tok, corpus))
    numbers["hso"] = timed("hso", lambda: _hso(model, tok, corpus))
    numbers["nar"] = timed("nar", lambda: _nar(data_dir, out / "nar", nar_seconds))
    numbers["seconds"] = time.time() - t0
    steps = ", ".join(f"{k} {v:.0f}s" for k, v in numbers["step_seconds"].items())
    print(f"\ndemo finished in {numbers['seconds']:.0f}s ({steps}); outputs in {out}/")
    return numbers


def _base(model, tok, corpus, ppl_tokens: int) -> dict:
    """The plain model's WikiText-2 test perplexity on ``ppl_tokens`` words, and its text
    under each of the demo's decoders."""
    from gencraft.metrics import text_perplexity
    from gencraft.models.generate import generate_text

    r = text_perplexity(model, tok, corpus.text("test", ppl_tokens), progress=False)
    ppl = {"tokens": r["tokens"], "token_ppl": r["perplexity"]}
    ppl["word_ppl"] = math.exp(r["nll"] / ppl_tokens)
    print(format_table([{"WikiText-2 test words": ppl_tokens, **ppl}]))
    print(f"\n>>> {PROMPT}")
    for name, kw in DECODERS.items():
        text = generate_text(model, tok, [PROMPT], seed=0, max_new_tokens=32, **kw)[0]
        print(f"[{name}] {text}")
    return ppl


def _search(model, tok, data_dir) -> dict:
    from gencraft.search import beam_search, exact_mode
    from gencraft.search.prompts import encode_prompt, instruction_texts

    _section(
        "2. beam search vs the exact mode (gencraft.search)",
        """
Search asks what the model's most probable output is. Beam search finds a likely output;
exact search (DFS with pruning) finds the most likely one within a node budget. For an
instruction model the best-scoring output is often empty or cut short (the "bad mode"); the
length-conditional mode, the best output of exactly n tokens, is a way around it.""",
    )
    text = instruction_texts("e2e", 1, data_dir)[0]
    ids = encode_prompt(tok, text)
    print(f">>> {text}")
    beam = beam_search(model, ids, num_beams=4, max_new_tokens=24)[0]
    mode = exact_mode(model, ids, max_new_tokens=24, max_nodes=80, initial=beam.tokens)
    n = max(1, len(beam.tokens))
    cond = exact_mode(model, ids, max_new_tokens=n, length=n, max_nodes=80, initial=beam.tokens[:n])
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
        "tree was ruled out within 80 nodes)"
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
    from gencraft.focus.evaluate import summarize
    from gencraft.focus.model import FocusForConditionalGeneration
    from gencraft.focus.train import FocusTrainConfig, FocusTrainer
    from gencraft.training import FitConfig

    _section(
        "3. FAME: focus attention and focus sampling (gencraft.focus)",
        f"""
FAME keeps a summary on the document's topic: a head reads the document through the model's
own attention and biases every next-token distribution towards the document's topic words
T_X (eq. 2). Here the head trains for about {seconds:.0f} s on 16 XSum documents over the
frozen SmolLM2. That is far too little to change summaries (docs/results/focus.md needs
hours), so the step shows what the head learned: the topic words it reads off a new
document.""",
    )
    train = load_summarization("xsum", "train", data_dir)[:16]
    valid = load_summarization("xsum", "validation", data_dir)[:4]
    test = load_summarization("xsum", "test", data_dir)[:1]
    cfg = FocusTrainConfig(
        freeze_base=True,
        lr=1e-3,
        fit=FitConfig(epochs=10, max_time=seconds, batch_size=4, warmup=0.1),
        max_source=192,
        max_target=32,
        frequent_size=500,
    )
    trainer = FocusTrainer(
        model, tok, train, valid, cfg, out, base_name_or_path="smollm2-135m", progress=True
    )
    result = trainer.train(restart=True)
    trainer.model.remove()  # reload the best head (lowest validation loss) on the same base
    fame = FocusForConditionalGeneration.from_pretrained(out / "best", base_model=model).eval()
    doc = test[0]
    words, in_doc = _topic_words(fame, tok, model, doc)
    for name, on in (("SmolLM2 alone, beam 4", False), ("FAME, beam 4", True)):
        fame.enabled = on
        summary = summarize(
            fame, tok, [doc.document], max_source=192, max_new_tokens=24, progress=False
        )[0][0]
        print(f"  {name}: {summary}")
    fame.enabled = True
    fame.remove()  # the base goes on plain to the next step
    return {
        "steps": result["steps"],
        "valid_loss": result["best_valid_loss"],
        "topic_words": words,
        "topic_words_in_document": in_doc,
    }


def _topic_words(fame, tok, model, doc) -> tuple[list[str], int]:
    """The 12 words the FAME head's topic logits rank highest for ``doc`` (frequent words
    left out), printed with how many occur in the document; returns (words, that count)."""
    ids = tok(doc.document, return_tensors="pt", truncation=True, max_length=192)["input_ids"]
    with torch.no_grad():
        topic = fame(input_ids=ids.to(model.device), return_focus=True).topic_logits[0]
    topic[fame.frequent_ids] = -float("inf")  # function words are always allowed anyway
    words = [tok.decode([i]).strip() for i in topic.topk(12).indices.tolist()]
    in_doc = sum(w.lower() in doc.document.lower() for w in words if w)
    print(f"\n[{doc.id}] reference: {doc.summary}")
    print(f"  T_X's top words: {', '.join(words)}  ({in_doc} of 12 occur in the document)")
    if in_doc < 6:
        print(
            "  After these few steps T_X is not yet the document's topic: the head needs hours "
            "of training (docs/results/focus.md) before its bias helps. With the bias on, the "
            "summary changes as follows:"
        )
    return words, in_doc


#: a passage where rare words repeat (the pointer's case): WikiText-2 valid's first article
POINTER_PASSAGE_WORDS = 120


def _pointer(model, tok, corpus, out: Path, seconds: float) -> dict:
    from gencraft.pointer import PointerSentinelHead
    from gencraft.pointer.analysis import head_passage_view, plot_passage
    from gencraft.training import FitConfig, fit

    _section(
        "4. pointer sentinel mixture (gencraft.pointer)",
        f"""
A pointer head lets the model copy a rare word it has already seen: it mixes the softmax
with a distribution over the last 100 tokens, weighted by a learned gate g (eq. 6). It trains
for about {seconds:.0f} s on WikiText-2 over the frozen SmolLM2 (333,696 new parameters); a
gain in perplexity takes far longer (docs/results/pointer.md), so the step shows where the
pointer looks when a rare word comes back.""",
    )
    torch.manual_seed(0)
    head = PointerSentinelHead(model, window=100, freeze_base=True)
    ids = tok(corpus.text("train", 12_000), return_tensors="pt")["input_ids"][0]
    chunks = [ids[i : i + 128] for i in range(0, ids.numel() - 128, 128)]

    def loss_fn(m, batch):  # batch: [B, 128] token ids (collate_fn=torch.stack)
        return m(batch).loss

    result = fit(
        head,
        torch.optim.Adam([p for p in head.parameters() if p.requires_grad], lr=1e-3),
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
    text = corpus.text("valid", POINTER_PASSAGE_WORDS)
    view = head_passage_view(head, tok, text, max_tokens=96)
    png = plot_passage(view, out / "gate.png", max_distance=96, title="pointer head, demo")
    # predictions of a token seen before in the passage: does the pointer look at it?
    repeats = []
    for i, target in enumerate(view.targets):
        seen = [i - d for d in range(min(i + 1, view.attention.shape[1]))]
        earlier = [j for j in seen if view.inputs[j] == target]
        if earlier and len(target.strip()) > 3:
            word = view.top[i][0]
            repeats.append((target, word == target, 1.0 - float(view.gate[i])))
    hits = sum(hit for _, hit, _ in repeats)
    share = sum(s for *_, s in repeats) / max(1, len(repeats))
    print(f"gate and pointer distribution on a WikiText-2 valid passage: {png}")
    print(
        f"{len(repeats)} predictions of a word seen earlier in the passage: the pointer's top "
        f"position holds that word in {hits}; its mean share there is 1 - g = {share:.1e}"
    )
    if hits < len(repeats) / 2:
        print(
            f"After {result.steps} steps the pointer has not yet learned where to look (the paper "
            "trains for 64 epochs); the plot shows what it does now: for each word, its "
            "distribution over the window and its share 1 - g of the probability."
        )
    return {"steps": result.steps, "repeats": len(repeats), "pointer_hits": hits, "png": str(png)}


def _prefix(data_dir, out: Path, seconds: float, device) -> dict:
    from gencraft.prefix import PrefixConfig
    from gencraft.prefix.config import PrefixTrainConfig
    from gencraft.prefix.functional import prefix_block_mask
    from gencraft.prefix.train import train
    from gencraft.training import FitConfig

    _section(
        "5. discourse-aware prefixes (gencraft.prefix)",
        f"""
Prefix-tuning adapts a frozen model to a task with a few trained key/value vectors; DASP's
UniBlock gives each segment of the input its own prefixes. Here 8 prefixes over 2 segments
train for about {seconds:.0f} s on E2E over the frozen SmolLM2 (the rate docs/prefix.md found,
5e-3): the validation loss falls, far from the paper's 10 epochs, and the mask shows which
prefixes each segment's tokens may read.""",
    )
    prefix = PrefixConfig(num_virtual_tokens=8, encoder_segments=2)  # UniBlock
    cfg = PrefixTrainConfig(
        task="e2e",
        train_examples=64,
        valid_examples=8,
        max_source_tokens=64,
        max_target_tokens=32,
        fit=FitConfig(epochs=5, batch_size=4, max_time=seconds, eval_every=2, warmup=0.1),
    )
    summary = train(cfg, prefix, out, data_dir=data_dir, progress=True, restart=True)
    losses = [r["valid_loss"] for r in summary["history"] if "valid_loss" in r]
    print(f"validation loss: {' -> '.join(f'{v:.3f}' for v in losses)}")
    mask = prefix_block_mask(torch.tensor([[0, 0, 0, 1, 1, 1]]), 8, 2)[0]
    print("which prefixes each input token may read (UniBlock, 2 segments):")
    for t, row in enumerate(mask.tolist()):
        print(f"  token {t} (segment {t // 3}): " + "".join("x" if v else "." for v in row))
    return {"steps": summary["steps"], "valid_losses": losses}


def _recurrence(model, tok, corpus) -> dict:
    from gencraft.metrics import windowed_nll
    from gencraft.recurrence import RecurrenceConfig, RecurrentLM
    from gencraft.recurrence.evaluate import flops_per_token

    _section(
        "6. recurrence between windows (gencraft.recurrence)",
        """
A transformer reads a long text window by window; cut into disjoint windows, each window
starts blind, and overlapping windows buy the context back at a price in compute. Recurrence
carries one vector h_prev from window to window instead. Training it needs GPU hours (the
thesis fine-tunes the whole model), so this step measures the gap recurrence is for, beside
the recurrent model before training: its FFN is random, so h_prev does not help it yet.""",
    )
    ids = tok(corpus.text("valid", 700), return_tensors="pt")["input_ids"][0][:768]
    rows = []
    for name, window, overlap in (("disjoint", 64, 0), ("overlap 32", 64, 32)):
        nll = windowed_nll(model, ids, window=window, overlap=overlap)
        rows.append(
            {
                "windows of 64": name,
                "token ppl": math.exp(float(nll.mean())),
                "GFLOPs/token": flops_per_token(model, window, overlap) / 1e9,
            }
        )
    rec = RecurrentLM(model, RecurrenceConfig(window=64, train_base=False)).eval()
    with torch.no_grad():
        nll = rec.windowed_token_nll(ids, window=64, overlap=0)
    rows.append(
        {
            "windows of 64": "recurrent (untrained)",
            "token ppl": math.exp(float(nll.mean())),
            "GFLOPs/token": flops_per_token(model, 64, 0) / 1e9,
        }
    )
    rec.remove()
    print(format_table(rows))
    return {r["windows of 64"]: r["token ppl"] for r in rows}


def _hso(model, tok, corpus) -> dict:
    from gencraft.hso import HSOConfig, hso_nll
    from gencraft.metrics import windowed_nll

    _section(
        "7. hidden-state optimisation (gencraft.hso)",
        """
HSO gets more out of a frozen model at test time: after each window of 25 tokens it takes one
Adam step on the cached keys and values, towards the tokens just read, so the next
predictions use a context fitted to this text. The weights never change.""",
    )
    ids = tok(corpus.text("valid", 320), return_tensors="pt")["input_ids"][0][:384]
    plain = windowed_nll(model, ids, window=ids.numel())
    hso = hso_nll(model, ids, HSOConfig(window=25, lr=0.003)).token_nll
    rows = [
        {"WikiText-2 valid, one context": "plain model", "token ppl": math.exp(plain.mean())},
        {"WikiText-2 valid, one context": "HSO (k=25)", "token ppl": math.exp(hso.mean())},
    ]
    print(format_table(rows))
    return {"plain": rows[0]["token ppl"], "hso": rows[1]["token ppl"], "tokens": ids.numel()}


def _nar(data_dir, out: Path, seconds: float) -> dict:
    from gencraft.data.tasks import source_of, task_examples
    from gencraft.nar import ConvertConfig, ObjectiveConfig, SamplingConfig
    from gencraft.nar.config import NARTrainConfig
    from gencraft.nar.evaluate import decode
    from gencraft.nar.train import train
    from gencraft.training import FitConfig, load_run

    _section(
        "8. RUM-SUNDAE: non-autoregressive generation (gencraft.nar)",
        f"""
A masked LM (MiniLM here) becomes a generator that writes every token at once and refines
them in a few steps, so the decoder runs a handful of times instead of once per token. After
{seconds:.0f} s of training on E2E the outputs are not yet fluent (docs/results/nar.md trains
for hours); what the step shows is the number of decoder calls each output took.""",
    )
    cfg = NARTrainConfig(
        task="e2e",
        train_examples=256,
        valid_examples=16,
        max_source_tokens=64,
        fit=FitConfig(epochs=5, batch_size=16, max_time=seconds, warmup=0.05),
    )
    convert = ConvertConfig(max_target_length=32)
    train(cfg, convert, ObjectiveConfig(), out, data_dir=data_dir, progress=True, restart=True)
    model, tok, _ = load_run(out / "best")
    example = task_examples("e2e", "test", data_dir)[0]
    rows = []
    for method, sampling in (
        ("sundae", SamplingConfig(steps=10, samples=4)),
        ("mask-predict", SamplingConfig(steps=10, length_candidates=3)),
    ):
        texts, res = decode(model, tok, [source_of(example)], sampling, method=method)
        rows.append({"decoding": method, "decoder calls": res.model_calls[0], "output": texts[0]})
    print(f">>> {source_of(example)}")
    print(format_table(rows))
    print("(an autoregressive decoder would call the model once per output token: up to 32)")
    return {r["decoding"]: r["decoder calls"] for r in rows}
