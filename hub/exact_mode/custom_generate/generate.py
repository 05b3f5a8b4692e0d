"""gencraft's exact_mode for `generate(custom_generate="<this folder>", trust_remote_code=True)`.

transformers calls `generate(model, **generate_arguments)` with the raw arguments of
`model.generate`; they go back through `generate` with gencraft's callable, which then
receives the prepared inputs, generation config, logits processors and stopping criteria.
"""

from gencraft.search.custom_generate import exact_mode as _decoder


def generate(model, *args, **kwargs):
    kwargs.pop("custom_generate", None)
    kwargs.pop("trust_remote_code", None)
    return model.generate(*args, custom_generate=_decoder, **kwargs)
