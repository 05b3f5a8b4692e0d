"""Recurrence between windows of a pretrained transformer (Yoshida 2023, ch. 2): the recurrent
model (:class:`RecurrentLM`) and its training (:mod:`gencraft.recurrence.train`). The overlap
evaluation of §2.3 is the shared :func:`gencraft.metrics.windowed_nll`, whose hook
:class:`RecurrentLM` implements to carry h_prev between windows."""

from gencraft.recurrence.config import RecurrenceConfig
from gencraft.recurrence.model import RecurrentLM

__all__ = ["RecurrenceConfig", "RecurrentLM"]
