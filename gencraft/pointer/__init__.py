"""Pointer sentinel mixture models (Merity et al. 2016).

* :func:`pointer_sentinel_log_probs` — the mixture (eqs. 2-8) on tensors.
* :class:`PointerSentinelLSTM` — the paper's model (zoneout LSTM + sentinel pointer).
* :class:`PointerSentinelHead` — the same mixture on top of any Hugging Face causal LM.
* :class:`PointerTrainer`, :func:`evaluate` — the paper's training
  recipe through ``accelerate``.
"""

from gencraft.pointer.evaluate import evaluate
from gencraft.pointer.functional import (
    pointer_attention,
    pointer_loss,
    pointer_sentinel_log_probs,
    pointer_target_log_probs,
    sequence_pointer_attention,
)
from gencraft.pointer.head import PointerSentinelHead
from gencraft.pointer.lstm import PRESETS, PointerSentinelConfig, PointerSentinelLSTM
from gencraft.pointer.rnn import LockedDropout, ZoneoutLSTM
from gencraft.pointer.train import PointerTrainer, TrainConfig, tbptt_schedule

__all__ = [
    "PRESETS",
    "LockedDropout",
    "PointerSentinelConfig",
    "PointerSentinelHead",
    "PointerSentinelLSTM",
    "PointerTrainer",
    "TrainConfig",
    "ZoneoutLSTM",
    "evaluate",
    "pointer_attention",
    "pointer_loss",
    "pointer_sentinel_log_probs",
    "pointer_target_log_probs",
    "sequence_pointer_attention",
    "tbptt_schedule",
]
