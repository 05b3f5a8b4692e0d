"""Search: beam search and conditional beam search, exact mode search (Yoshida 2023, ch. 5-7).

``beam_search`` owns its loop (``transformers`` no longer accepts custom beam scorers); with no
classifier it returns what ``generate(num_beams=K, do_sample=False)`` returns under the same
``length_penalty`` and ``early_stopping`` (gencraft's defaults: 0.0 and True, the thesis's
scoring). ``exact_mode`` finds the most probable output by DFS with
pruning and O(depth) key/value memory on greedy paths. ``beam_search_batch`` and
``exact_mode_batch`` take a padded batch ``[B, P]`` with its attention mask and search every
row together (one model call per step); the single-input functions are their batch of one.
Their settings are one frozen ``BeamSettings`` (or its fields as keywords);
``beam_search_tensors`` returns the batched search's tensors (``BeamResult``).
``search_errors`` compares greedy and beam outputs with the proven mode of each prompt.
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
            "BeamResult",
            "BeamSettings",
            "Hypothesis",
            "beam_search",
            "beam_search_batch",
            "beam_search_tensors",
        ),
        "gencraft.search.errors": (
            "SearchErrorRow",
            "SearchOutcome",
            "error_table",
            "search_errors",
        ),
        "gencraft.search.mbr": ("mbr_generate_text",),
        "gencraft.search.exact": (
            "ModeResult",
            "exact_mode",
            "exact_mode_batch",
        ),
    },
)
