"""Model registry: ``load_model(name_or_path) -> (model, tokenizer)``.

Registered names: ``smollm2-135m``, ``minilm-l6`` and the random ``tiny-*`` test models; any
local directory, ``.gguf`` file or Hugging Face hub id works too.
"""

from gencraft.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "gencraft.models.method": (
            "MethodModel",
            "load_method",
        ),
        "gencraft.models.registry": (
            "MODELS",
            "TASKS",
            "ModelInfo",
            "infer_task",
            "list_models",
            "load_model",
        ),
        "gencraft.models.tiny": (
            "TINY_BUILDERS",
            "build_tiny_model",
            "build_tiny_tokenizer",
        ),
    },
)
