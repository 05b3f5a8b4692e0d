"""Search: beam search and conditional beam search, exact mode search (Yoshida 2023, ch. 5-7).

``beam_search`` owns its loop (``transformers`` no longer accepts custom beam scorers); with no
classifier it returns what ``generate(num_beams=B, do_sample=False, length_penalty=0.0,
early_stopping=True)`` returns. ``exact_mode`` finds the most probable output by DFS with
pruning and O(depth) key/value memory on greedy paths.
"""

from gencraft.models.stepping import HFStepper, StepOutput, Stepper
from gencraft.search.beam import AttributeScorer, Hypothesis, beam_search
from gencraft.search.exact import ModeResult, exact_mode

__all__ = [
    "AttributeScorer",
    "HFStepper",
    "Hypothesis",
    "ModeResult",
    "StepOutput",
    "Stepper",
    "beam_search",
    "exact_mode",
]
