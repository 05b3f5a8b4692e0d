"""Recurrence between windows of a pretrained transformer (Yoshida 2023, ch. 2): the recurrent
model (:class:`RecurrentLM`), its training (:mod:`gencraft.recurrence.train`) and the overlap
evaluation of §2.3 (:func:`windowed_nll`)."""

from gencraft.recurrence.config import RecurrenceConfig
from gencraft.recurrence.evaluate import Window, window_schedule, windowed_nll
from gencraft.recurrence.model import RecurrentLM

__all__ = ["RecurrenceConfig", "RecurrentLM", "Window", "window_schedule", "windowed_nll"]
