"""Non-autoregressive generation from one pretrained masked LM: RUM-SUNDAE (Yoshida 2023,
ch. 4), with Mask-Predict and SUNDAE from scratch as its peers."""

from gencraft.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "gencraft.nar.config": (
            "ConvertConfig",
            "ObjectiveConfig",
            "SamplingConfig",
        ),
        "gencraft.nar.model": (
            "NARSeq2Seq",
            "load_mlm_seq2seq",
            "mlm_to_seq2seq",
        ),
    },
)
