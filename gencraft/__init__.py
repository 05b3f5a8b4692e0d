"""gencraft: better text out of neural language models.

Shared foundation: :mod:`gencraft.models` (model registry), :mod:`gencraft.data`
(datasets), :mod:`gencraft.metrics` (evaluation), :mod:`gencraft.cli` (command line).
"""

from gencraft.errors import DataError, GencraftError, ModelLoadError

__version__ = "0.1.0"

__all__ = ["DataError", "GencraftError", "ModelLoadError", "__version__"]
