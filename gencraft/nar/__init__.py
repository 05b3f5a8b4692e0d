"""Non-autoregressive generation from one pretrained masked LM: RUM-SUNDAE (Yoshida 2023,
ch. 4), with Mask-Predict and SUNDAE from scratch as its peers."""

from gencraft.nar.config import ConvertConfig, ObjectiveConfig, SamplingConfig
from gencraft.nar.model import NARSeq2Seq, load_mlm_seq2seq, mlm_to_seq2seq

__all__ = [
    "ConvertConfig",
    "NARSeq2Seq",
    "ObjectiveConfig",
    "SamplingConfig",
    "load_mlm_seq2seq",
    "mlm_to_seq2seq",
]
