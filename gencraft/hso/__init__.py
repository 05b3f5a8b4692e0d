"""Hidden-state optimisation (Yoshida 2023, ch. 3) and its dynamic-evaluation baseline.

``hso_nll(model, ids, HSOConfig())`` scores a text while taking Adam steps on the cached
keys/values of a frozen causal LM; ``hso_prefill`` returns the optimised cache of a prompt
for ``generate``; ``dynamic_eval_nll`` updates the weights instead (Krause et al. 2018).
"""

from gencraft.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "gencraft.hso.config": (
            "DynamicEvalConfig",
            "HSOConfig",
        ),
        "gencraft.hso.dynamic": (
            "dynamic_eval_nll",
            "dynamically_evaluated",
        ),
        "gencraft.hso.functional": (
            "TokenScores",
            "hso_nll",
            "hso_nll_batch",
            "hso_prefill",
        ),
    },
)
