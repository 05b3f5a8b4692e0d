"""gencraft's context_aware (CAD) for `generate(custom_generate="<this folder>", trust_remote_code=True)`.

transformers calls `generate(model, **generate_arguments)` with the raw arguments of
`model.generate`; they go back through `generate` with gencraft's callable, which then
receives the prepared inputs, generation config, logits processors and stopping criteria.
"""

from gencraft.search.custom_generate import context_aware as _decoder
from gencraft.search.custom_generate import hub_generate


def generate(model, *args, **kwargs):
    return hub_generate(_decoder, model, *args, **kwargs)
