"""Focus attention (FAME) and focus sampling (Aralikatte et al., ACL 2021).

* :class:`FocusHead` — source-conditioned vocabulary bias t_x, topic logits T_X, focus bias f_t.
* :func:`topic_loss`, :func:`frequent_token_ids` — the summary-induced topic loss (eq. 3).
* :class:`FocusForConditionalGeneration` — FAME on any HF encoder-decoder or causal LM:
  forward, generate (with focus decoding), save/load.
* :func:`focus_vocabulary`, :class:`FocusLogitsProcessor`, :func:`peakiness` — focus decoding
  (eq. 5) as a ``transformers`` logits processor.
"""

from gencraft.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "gencraft.focus.decoding": (
            "FocusLogitsProcessor",
            "focus_vocabulary",
            "oracle_vocabulary",
            "peakiness",
        ),
        "gencraft.focus.functional": (
            "frequent_token_ids",
            "topic_loss",
            "topic_targets",
        ),
        "gencraft.focus.head": (
            "FocusHead",
            "FocusOutput",
        ),
        "gencraft.focus.model": (
            "FocusConfig",
            "FocusForConditionalGeneration",
            "FocusModelOutput",
        ),
    },
)
