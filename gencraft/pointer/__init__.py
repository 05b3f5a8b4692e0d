"""Pointer sentinel mixture models (Merity et al. 2016).

* :func:`pointer_sentinel_log_probs` — the mixture (eqs. 2-8) on tensors.
* :class:`PointerSentinelLSTM` — the paper's model (zoneout LSTM + sentinel pointer).
* :class:`PointerSentinelHead` — the same mixture on top of any Hugging Face causal LM.
* :class:`PointerTrainer`, :func:`evaluate` — the paper's training
  recipe through ``accelerate``.
"""

from gencraft.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "gencraft.pointer.evaluate": ("evaluate",),
        "gencraft.pointer.functional": (
            "pointer_attention",
            "pointer_loss",
            "pointer_sentinel_log_probs",
            "pointer_target_log_probs",
            "sequence_pointer_attention",
        ),
        "gencraft.pointer.head": ("PointerSentinelHead",),
        "gencraft.pointer.lstm": (
            "PRESETS",
            "PointerSentinelConfig",
            "PointerSentinelLSTM",
        ),
        "gencraft.pointer.rnn": (
            "LockedDropout",
            "ZoneoutLSTM",
        ),
        "gencraft.pointer.train": (
            "PointerTrainer",
            "TrainConfig",
            "tbptt_schedule",
        ),
    },
)
