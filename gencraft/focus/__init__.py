"""Focus attention (FAME) and focus sampling (Aralikatte et al., ACL 2021).

* :class:`FocusHead` — source-conditioned vocabulary bias t_x, topic logits T_X, focus bias f_t.
* :func:`topic_loss`, :func:`frequent_token_ids` — the summary-induced topic loss (eq. 3).
* :class:`FocusForConditionalGeneration` — FAME on any HF encoder-decoder or causal LM:
  forward, generate (with focus decoding), save/load.
* :func:`focus_vocabulary`, :class:`FocusLogitsProcessor`, :func:`peakiness` — focus decoding
  (eq. 5) as a ``transformers`` logits processor.
"""

from gencraft.focus.decoding import (
    FocusLogitsProcessor,
    focus_vocabulary,
    oracle_vocabulary,
    peakiness,
)
from gencraft.focus.functional import frequent_token_ids, topic_loss, topic_targets
from gencraft.focus.head import FocusHead, FocusOutput
from gencraft.focus.model import FocusConfig, FocusForConditionalGeneration, FocusModelOutput

__all__ = [
    "FocusConfig",
    "FocusForConditionalGeneration",
    "FocusHead",
    "FocusLogitsProcessor",
    "FocusModelOutput",
    "FocusOutput",
    "focus_vocabulary",
    "frequent_token_ids",
    "oracle_vocabulary",
    "peakiness",
    "topic_loss",
    "topic_targets",
]
