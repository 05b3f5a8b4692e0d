"""Recurrence between windows of a pretrained transformer (Yoshida 2023, ch. 2): so far the
overlap evaluation of §2.3 (:func:`windowed_nll`); the recurrent model is issue 15's next step.
"""

from gencraft.recurrence.evaluate import Window, window_schedule, windowed_nll

__all__ = ["Window", "window_schedule", "windowed_nll"]
