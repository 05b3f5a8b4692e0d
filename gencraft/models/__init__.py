"""Model registry: ``load_model(name_or_path) -> (model, tokenizer)``.

Registered names: ``smollm2-135m``, ``minilm-l6`` and the random ``tiny-*`` test models; any
local directory, ``.gguf`` file or Hugging Face hub id works too.
"""

from gencraft.models.method import MethodModel, load_method
from gencraft.models.registry import MODELS, TASKS, ModelInfo, infer_task, list_models, load_model
from gencraft.models.tiny import TINY_BUILDERS, build_tiny_model, build_tiny_tokenizer

__all__ = [
    "MODELS",
    "TASKS",
    "TINY_BUILDERS",
    "MethodModel",
    "ModelInfo",
    "build_tiny_model",
    "build_tiny_tokenizer",
    "infer_task",
    "list_models",
    "load_method",
    "load_model",
]
