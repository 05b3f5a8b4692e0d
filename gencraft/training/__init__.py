"""The training machinery every gencraft method shares: :func:`fit` (the one training loop, on
``accelerate``), checkpoints that resume after an interrupt, the one run format
(:func:`save_run` / :func:`load_run`), schedules (warm-up/decay, the plateau rule, truncated
BPTT) and RNG/atomic-file helpers."""

from gencraft.training.checkpoint import (
    Interrupted,
    InterruptGuard,
    RunCheckpoint,
    resume_command,
    save_directory,
)
from gencraft.training.fit import (
    EpochSampler,
    FitConfig,
    FitResult,
    fit,
    fit_options,
    make_accelerator,
    mean_loss,
    settings_of,
)
from gencraft.training.run import (
    RUN_SETTINGS,
    LoadedRun,
    load_run,
    model_directory,
    read_settings,
    save_run,
)
from gencraft.training.schedules import (
    PlateauSchedule,
    Step,
    batchify,
    tbptt_schedule,
    warmup_schedule,
)
from gencraft.training.state import (
    atomic_torch_save,
    load_torch,
    rng_state,
    set_rng_state,
    write_json,
)

__all__ = [
    "RUN_SETTINGS",
    "EpochSampler",
    "FitConfig",
    "FitResult",
    "InterruptGuard",
    "Interrupted",
    "LoadedRun",
    "PlateauSchedule",
    "RunCheckpoint",
    "Step",
    "atomic_torch_save",
    "batchify",
    "fit",
    "fit_options",
    "load_run",
    "load_torch",
    "make_accelerator",
    "mean_loss",
    "model_directory",
    "read_settings",
    "resume_command",
    "rng_state",
    "save_directory",
    "save_run",
    "set_rng_state",
    "settings_of",
    "tbptt_schedule",
    "warmup_schedule",
    "write_json",
]
