"""``gencraft demo``: the README's main job, offline, a few minutes on 2 CPU cores.

SmolLM2-135M-Instruct: perplexity on the start of WikiText-2 test; greedy, beam and nucleus
decoding from three fixed prompts; zero-shot summaries of three XSum documents with ROUGE.
"""

from __future__ import annotations

import math
import time

from tqdm.auto import tqdm

from gencraft.cli.evaluate import format_table

PROMPTS = (
    "What is the capital of France?",
    "Write a two-line poem about autumn leaves.",
    "Explain in one sentence why the sky is blue.",
)
DECODERS = {
    "greedy": {"do_sample": False, "num_beams": 1},
    "beam-4": {"do_sample": False, "num_beams": 4, "early_stopping": True},
    "nucleus-0.9": {"do_sample": True, "top_p": 0.9, "top_k": 0},
}
SUMMARY_PROMPT = "Summarize the following article in one sentence.\n\n{document}"
N_SUMMARIES = 3
DOC_WORDS = 400  # keep prompts short on CPU; the documents average 315 words


def _section(title: str) -> None:
    print(f"\n=== {title} ===", flush=True)


def run_demo(
    data_dir: str | None = None, ppl_tokens: int = 8000, device: str | None = None
) -> None:
    from gencraft.data import load_lm_corpus, load_summarization
    from gencraft.metrics import rouge, text_perplexity
    from gencraft.models import load_model
    from gencraft.models.generate import generate_text

    t0 = time.time()
    _section("model")
    model, tok = load_model("smollm2-135m", device=device)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"SmolLM2-135M-Instruct ({n_params / 1e6:.1f}M parameters, GGUF Q4_1 dequantised), "
        f"loaded in {time.time() - t0:.1f}s"
    )

    _section(f"perplexity: first {ppl_tokens:,} words of WikiText-2 test")
    corpus = load_lm_corpus("wikitext-2", data_dir, splits=("test",))
    r = text_perplexity(model, tok, corpus.text("test", ppl_tokens))
    print(
        format_table(
            [
                {
                    "tokens (SmolLM2)": r["tokens"],
                    "token ppl": r["perplexity"],
                    "words": ppl_tokens,
                    "word ppl": math.exp(r["nll"] / ppl_tokens),
                }
            ]
        )
    )
    print("(word ppl = same summed NLL over WikiText words incl. <eos>; <unk> stays literal)")

    _section("generation: greedy / beam / nucleus (seed 0), 48 new tokens, chat template")
    for prompt in tqdm(PROMPTS, desc="prompts"):
        tqdm.write(f"\n>>> {prompt}")
        for name, kw in DECODERS.items():
            out = generate_text(model, tok, [prompt], seed=0, max_new_tokens=48, **kw)[0]
            tqdm.write(f"[{name}] {out}")

    _section(f"zero-shot summaries: {N_SUMMARIES} XSum docs (xsum-1000 local test split)")
    docs = load_summarization("xsum", "test", data_dir)[:N_SUMMARIES]
    preds = []
    for ex in tqdm(docs, desc="summarize"):
        doc = " ".join(ex.document.split()[:DOC_WORDS])
        preds.append(
            generate_text(
                model,
                tok,
                [SUMMARY_PROMPT.format(document=doc)],
                max_new_tokens=60,
                do_sample=False,
                num_beams=1,
            )[0]
        )
    for ex, pred in zip(docs, preds, strict=True):
        print(f"\n[{ex.id}]\n  reference: {ex.summary}\n  SmolLM2:   {pred}")
    scores = rouge(preds, [ex.summary for ex in docs])
    print()
    print(
        format_table(
            [
                {
                    "docs": len(docs),
                    "ROUGE-1": scores["rouge1"],
                    "ROUGE-2": scores["rouge2"],
                    "ROUGE-L": scores["rougeL"],
                }
            ]
        )
    )
    print(f"\ndemo finished in {time.time() - t0:.0f}s")
