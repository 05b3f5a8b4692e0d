"""``--device`` / ``--dtype`` checks (gencraft.models.placement) over drawn machines and
arguments, against a reference written from the docs: which device a string names, which ones
are refused on a machine with or without a CUDA build, GPUs and MPS, and which dtype a name
gives (float16 refused on a CPU); under a launcher, an unnumbered GPU is the process's own
(``LOCAL_RANK`` modulo the GPUs), not GPU 0 for every process."""

from __future__ import annotations

import os
from contextlib import ExitStack
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gencraft.errors import ConfigError
from gencraft.models.placement import DTYPES, check_device, check_dtype, check_placement

DEVICE_STRINGS = [
    None,
    "cpu",
    "cuda",
    "cuda:0",
    "cuda:1",
    "cuda:3",
    "mps",
    "meta",
    "xpu",
    "gpu0",
    "cuda:x",
    "CPU",
    "",
    "hpu",
    "ipu",
]
DTYPE_NAMES = [None, "auto", "float32", "bfloat16", "float16", "fp16", "half", "int8"]
DTYPE_OBJECTS = [torch.float32, torch.bfloat16, torch.float16]


def machine(cuda_built: bool, gpus: int, mps: bool) -> ExitStack:
    """Pretend to be a machine with that torch build, GPU count and MPS."""
    stack = ExitStack()
    stack.enter_context(mock.patch.object(torch.backends.cuda, "is_built", lambda: cuda_built))
    stack.enter_context(mock.patch.object(torch.cuda, "device_count", lambda: gpus))
    stack.enter_context(
        mock.patch.object(torch.cuda, "is_available", lambda: cuda_built and gpus > 0)
    )
    stack.enter_context(mock.patch.object(torch.backends.mps, "is_available", lambda: mps))
    return stack


def reference_device(
    device, cuda_built: bool, gpus: int, mps: bool, launch: tuple[int, int] = (1, 0)
) -> str | torch.device:
    """The device, or the start of the one-line refusal (docs/core.md, 'devices'); under a
    launcher of ``launch`` = (processes, local rank), an unnumbered GPU is the process's own."""
    world, rank = launch
    own = torch.device("cuda", rank % gpus) if world > 1 and gpus else torch.device("cuda")
    if device is None:
        return own if cuda_built and gpus > 0 else torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        return f"--device {device}: not a device"
    if dev.type == "cuda":
        if not cuda_built:
            return f"--device {device}: this torch"
        if gpus == 0:
            return f"--device {device}: no CUDA GPU is visible"
        if dev.index is not None and dev.index >= gpus:
            return f"--device {device}: this machine has {gpus} GPU(s) (cuda:0 to cuda:{gpus - 1})"
        return dev if dev.index is not None else own
    if dev.type == "mps":
        return dev if mps else f"--device {device}: MPS is not available"
    if dev.type in ("cpu", "xpu", "meta"):
        return dev
    return f"--device {device}: gencraft runs on cpu, cuda or mps, not {dev.type}"


def reference_dtype(dtype, device: torch.device) -> str | torch.dtype | None:
    value = dtype if dtype is None or isinstance(dtype, torch.dtype) else None
    if isinstance(dtype, str):
        names = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16}
        names["float16"] = torch.float16
        if dtype not in names:
            return f"--dtype {dtype}: choose one of auto, float32, bfloat16, float16"
        value = names[dtype]
    if value is torch.float16 and device.type == "cpu":
        return "--dtype float16 on the CPU"
    return value


@settings(max_examples=150, deadline=None)
@given(
    device=st.sampled_from(DEVICE_STRINGS),
    dtype=st.sampled_from(DTYPE_NAMES + DTYPE_OBJECTS),
    cuda_built=st.booleans(),
    gpus=st.integers(0, 3),
    mps=st.booleans(),
    launch=st.sampled_from([(1, 0), (2, 0), (2, 1), (4, 3), (8, 5)]),
)
def test_device_and_dtype_checks_match_the_reference(device, dtype, cuda_built, gpus, mps, launch):
    want_dev = reference_device(device, cuda_built, gpus, mps, launch)
    env = {"WORLD_SIZE": str(launch[0]), "LOCAL_RANK": str(launch[1])}
    with machine(cuda_built, gpus, mps), mock.patch.dict(os.environ, env):
        if isinstance(want_dev, str):
            for check in (lambda: check_device(device), lambda: check_placement(device, dtype)):
                with pytest.raises(ConfigError) as err:
                    check()
                message = str(err.value)
                assert message.startswith(want_dev), (message, want_dev)
                assert "\n" not in message
            return
        assert check_device(device) == want_dev
        want_dtype = reference_dtype(dtype, want_dev)
        if isinstance(want_dtype, str):
            with pytest.raises(ConfigError) as err:
                check_placement(device, dtype)
            assert str(err.value).startswith(want_dtype), (str(err.value), want_dtype)
            assert "\n" not in str(err.value)
        else:
            assert check_placement(device, dtype) == (want_dev, want_dtype)
            assert check_dtype(dtype, want_dev) is want_dtype


def test_the_dtype_names_are_the_cli_choices():
    import typing

    from gencraft.cli.options import RunOptions

    choices = typing.get_args(typing.get_type_hints(RunOptions)["dtype"])
    assert tuple(DTYPES) == choices == ("auto", "float32", "bfloat16", "float16")
