"""The training machinery every gencraft method shares: :func:`fit` (the one training loop, on
``accelerate``), checkpoints that resume after an interrupt, the one run format
(:func:`save_run` / :func:`load_run`), schedules (warm-up/decay, the plateau rule, truncated
BPTT), callbacks (:class:`TrainerCallback`) and RNG/atomic-file helpers."""

from gencraft.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "gencraft.training.checkpoint": (
            "InterruptGuard",
            "RunCheckpoint",
            "resume_command",
            "save_directory",
        ),
        "gencraft.errors": ("Interrupted",),
        "gencraft.training.config": ("FitConfig", "fit_options", "settings_of"),
        "gencraft.training.fit": (
            "EpochSampler",
            "FitResult",
            "StepState",
            "Steps",
            "TrainerCallback",
            "Validated",
            "fit",
            "make_accelerator",
            "mean_loss",
        ),
        "gencraft.training.run": (
            "RUN_SETTINGS",
            "LoadedRun",
            "load_run",
            "model_directory",
            "read_settings",
            "save_run",
        ),
        "gencraft.training.schedules": (
            "PlateauSchedule",
            "Step",
            "batchify",
            "tbptt_schedule",
            "warmup_schedule",
        ),
        "gencraft.training.state": (
            "atomic_torch_save",
            "load_torch",
            "rng_state",
            "set_rng_state",
            "write_json",
        ),
    },
)
