"""Recurrence between windows of a pretrained transformer (Yoshida 2023, ch. 2): the recurrent
model (:class:`RecurrentLM`) and its training (:mod:`gencraft.recurrence.train`). The overlap
evaluation of §2.3 is the shared :func:`gencraft.metrics.windowed_nll`, whose hook
:class:`RecurrentLM` implements to carry h_prev between windows."""

from gencraft.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "gencraft.recurrence.config": ("RecurrenceConfig",),
        "gencraft.recurrence.model": ("RecurrentLM",),
    },
)
