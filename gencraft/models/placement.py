"""Where a model runs and in which dtype: the ``--device`` and ``--dtype`` of every command
that loads a model, checked before anything loads, so a missing CUDA, a misspelt device or
float16 on a CPU costs one line and no work.

``--dtype auto`` keeps gencraft's default, float32 (the dtype every number in the docs was
measured in); ``bfloat16`` and ``float16`` halve the memory. Methods keep their float32
islands (softmaxes, log-probabilities, the pointer LSTM) whatever the weights' dtype.
"""

from __future__ import annotations

import torch

from gencraft.errors import ConfigError
from gencraft.utils import default_device, local_gpu, world_size

DTYPES: dict[str, torch.dtype | None] = {
    "auto": None,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def check_device(device: str | torch.device | None) -> torch.device:
    """``device`` (None: CUDA when there is one, else the CPU) as a ``torch.device``, or a
    :class:`ConfigError` in one line: a string torch cannot read, CUDA where this torch or
    machine has none, a GPU index past the last one, MPS where there is none."""
    if device is None:
        return torch.device(default_device())
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ConfigError(
            f"--device {device}: not a device; use cpu, cuda, cuda:N or mps"
        ) from None
    if dev.type == "cuda":
        if not torch.backends.cuda.is_built():
            raise ConfigError(
                f"--device {device}: this torch ({torch.__version__}) was built without CUDA; "
                "install a CUDA build of torch, or use --device cpu"
            )
        count = torch.cuda.device_count()
        if count == 0:
            raise ConfigError(f"--device {device}: no CUDA GPU is visible on this machine")
        if dev.index is not None and dev.index >= count:
            raise ConfigError(
                f"--device {device}: this machine has {count} GPU(s) (cuda:0 to cuda:{count - 1})"
            )
        if dev.index is None and world_size() > 1:  # one GPU per launched process
            dev = torch.device("cuda", local_gpu())
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"--device {device}: MPS is not available on this machine")
    elif dev.type not in ("cpu", "cuda", "mps", "xpu", "meta"):
        raise ConfigError(f"--device {device}: gencraft runs on cpu, cuda or mps, not {dev.type}")
    return dev


def check_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype | None:
    """The ``torch.dtype`` of a ``--dtype`` name (None for ``auto``: float32), refused in one
    line when unknown, or float16 on a CPU (whose float16 kernels are slow or missing; bfloat16
    is the half precision a CPU runs)."""
    if isinstance(dtype, torch.dtype) or dtype is None:
        value = dtype
    elif dtype in DTYPES:
        value = DTYPES[dtype]
    else:
        raise ConfigError(f"--dtype {dtype}: choose one of {', '.join(DTYPES)}")
    if value is torch.float16 and device.type == "cpu":
        raise ConfigError(
            "--dtype float16 on the CPU: use float32 or bfloat16 there (float16 is for GPUs)"
        )
    return value


def check_placement(
    device: str | torch.device | None, dtype: str | torch.dtype | None = None
) -> tuple[torch.device, torch.dtype | None]:
    """(device, dtype) checked together (:func:`check_device`, :func:`check_dtype`)."""
    dev = check_device(device)
    return dev, check_dtype(dtype, dev)
