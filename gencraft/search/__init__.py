"""Search: beam search and conditional beam search, exact mode search (Yoshida 2023, ch. 5-7).

``beam_search`` owns its loop (``transformers`` no longer accepts custom beam scorers); with no
classifier it returns what ``generate(num_beams=B, do_sample=False, length_penalty=0.0,
early_stopping=True)`` returns. ``exact_mode`` finds the most probable output by DFS with
pruning and O(depth) key/value memory on greedy paths. ``beam_search_batch`` and
``exact_mode_batch`` take a padded batch ``[B, P]`` with its attention mask and search every
row together (one model call per step); the single-input functions are their batch of one.
"""

from gencraft.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "gencraft.models.stepping": (
            "HFStepper",
            "StepOutput",
            "Stepper",
        ),
        "gencraft.search.beam": (
            "AttributeScorer",
            "Hypothesis",
            "beam_search",
            "beam_search_batch",
        ),
        "gencraft.search.exact": (
            "ModeResult",
            "exact_mode",
            "exact_mode_batch",
        ),
    },
)
