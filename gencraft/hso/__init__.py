"""Hidden-state optimisation (Yoshida 2023, ch. 3) and its dynamic-evaluation baseline.

``hso_nll(model, ids, HSOConfig())`` scores a text while taking Adam steps on the cached
keys/values of a frozen causal LM; ``hso_prefill`` returns the optimised cache of a prompt
for ``generate``; ``dynamic_eval_nll`` updates the weights instead (Krause et al. 2018).
"""

from gencraft.hso.config import DynamicEvalConfig, HSOConfig
from gencraft.hso.dynamic import dynamic_eval_nll, dynamically_evaluated
from gencraft.hso.functional import TokenScores, hso_nll, hso_prefill

__all__ = [
    "DynamicEvalConfig",
    "HSOConfig",
    "TokenScores",
    "dynamic_eval_nll",
    "dynamically_evaluated",
    "hso_nll",
    "hso_prefill",
]
