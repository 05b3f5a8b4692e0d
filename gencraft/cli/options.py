"""The option groups every command shares, as dataclasses (one name per concept across all
commands). A command adds the fields that apply to it with
``add_dataclass_arguments(parser, RunOptions, only=(...), defaults={...})``; old spellings
stay accepted as hidden aliases for one release (``--beams``, ``--data``, ``--max-train``,
``--max-valid``, nar eval's ``--predictions``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gencraft.config import REQUIRED, option, positive


@dataclass
class RunOptions:
    """Where a command writes and how it runs."""

    output: str | None = option(
        None,
        "where the results go (a training run resumes there)",
        aliases=("--output-dir", "--predictions"),
    )
    restart: bool = option(
        False,
        "start over: clear what an earlier run left in --output (a training run, an output "
        "file, its partial results) instead of resuming it or refusing",
    )
    quiet: bool = option(False, "no progress bars")
    seed: int = option(0, "seed of every random draw")
    device: str | None = option(None, "cpu, cuda or cuda:N (default: cuda when there is one)")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = option(
        "auto", "dtype the model's weights load in (auto: float32; float16 needs a GPU)"
    )
    json: bool = option(False, "print JSON instead of a table")


@dataclass
class DataOptions:
    """Which data a command reads."""

    data_dir: str | None = option(
        None, "directory holding the dataset folders (default: $GENCRAFT_DATA_DIR)"
    )
    task: str | None = option(
        None,
        "dataset, or a path to your own (.jsonl/.csv/.tsv file or a folder of split files; "
        "default: the one the run was trained on)",
        aliases=("--data",),
    )
    source_field: str | None = option(
        None, "with --task PATH: the input field (default: the run's, else 'source')"
    )
    target_field: str | None = option(
        None, "with --task PATH: the reference field (default: the run's, else 'target')"
    )
    corpus: str | None = option(
        None,
        "LM corpus, or a path to your own (a text file, or a folder with train.txt, valid.txt "
        "and test.txt; default: the one the run was trained on)",
    )
    split: str = option("test", "split")
    limit: int | None = option(None, "the first N examples (default: all)")
    max_words: int | None = option(None, "the first N words of the split (default: all)")
    spread: bool = option(False, "with --limit: N examples evenly spaced over the split")
    lowercase: bool = option(
        False,
        "score outputs and references lower-cased (an uncased tokenizer's outputs, or older "
        "tables' convention); the report says so",
    )
    train_examples: int | None = option(
        None, "the first N training examples", aliases=("--max-train",)
    )
    valid_examples: int | None = option(
        None, "the first N validation examples", aliases=("--max-valid",)
    )

    def __post_init__(self) -> None:
        counts = ("limit", "max_words", "train_examples", "valid_examples")
        positive(self, *counts, allow_none=True)  # --limit -1 is not Python's slice here


@dataclass
class DecodeOptions:
    """How a command generates."""

    num_beams: int = option(4, "beam size (1: greedy)", aliases=("--beams",))
    max_new_tokens: int = option(64, "tokens generated at most")
    batch_size: int = option(8, "inputs per batch")

    def __post_init__(self) -> None:
        positive(self, "max_new_tokens", "batch_size")
        positive(self, "num_beams", allow_none=True)  # None: the command's own default


@dataclass
class RunInput:
    """The trained run a command loads."""

    checkpoint: str = option(
        REQUIRED,
        "a training output directory (its best/ is loaded) or a saved model directory",
        positional=True,
    )


@dataclass
class ModelInput:
    """The model a command starts from."""

    model: str = option(REQUIRED, "registered name (gencraft models), local path or hub id")


def default_output(output: str | None, *parts: str) -> Path:
    """``--output``, else ``outputs/<parts joined by ->`` (a dataset or model given as a path
    contributes its last name, not the path); checked writable (:func:`check_output`)."""
    from gencraft.data.own import spec_name

    out = Path(output) if output else Path("outputs")
    if not output:
        out = out / "-".join(spec_name(str(p).rstrip("/")) for p in parts if p)
    check_output(out, "dir")
    return out


def check_output(path: str | Path, kind: str) -> None:
    """Refuse in one line, before any work, an output that cannot be written: a folder
    (``kind="dir"``: a run, plots) where a file is, or a file where a folder is, or a place
    this user cannot write. A folder is created; a new file is probed and removed."""
    import os

    from gencraft.errors import ConfigError

    p = Path(path).expanduser()
    if kind == "dir" and p.exists() and not p.is_dir():
        raise ConfigError(f"--output {path} is a file; give a folder (this writes several files)")
    if kind == "file" and p.is_dir():
        raise ConfigError(f"--output {path} is a folder; give a file name")
    folder = p if kind == "dir" else p.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if kind == "file" and not p.exists():
            p.touch()
            p.unlink()
        probe = folder / f".gencraft-write-check-{os.getpid()}"
        probe.touch()
        probe.unlink()
        if kind == "file" and p.exists() and not os.access(p, os.W_OK):
            raise PermissionError(f"{p} is read-only")
    except OSError as err:
        why = err.strerror or str(err)
        raise ConfigError(f"--output {path}: cannot write there ({why})") from None


def read_prompt_file(path: str) -> list[str]:
    """The prompts of a ``--prompt-file``, one a line, blank lines skipped; refused in one
    line when it holds none."""
    from gencraft.data import read_lines
    from gencraft.errors import GencraftError

    prompts = [p for p in read_lines(path) if p.strip()]
    if not prompts:
        raise GencraftError(f"--prompt-file {path} holds no prompt (it is empty or blank)")
    return prompts


def partial_folder(output: str | None) -> Path | None:
    """Where a file command keeps its finished batches until the file is written: beside
    ``--output``, as ``F.partial/`` (:func:`gencraft.distributed.map_sharded`)."""
    return Path(output + ".partial") if output else None


def claim_output(args: object) -> None:
    """The one rule for a command that writes one ``--output`` file, applied before any work:
    a suffix the command cannot write (``args.output_suffixes``) is refused; an existing file
    is refused unless ``--restart`` says to replace it (it is overwritten when the new one is
    written, so a run refused later keeps it); ``--restart`` clears the partial results
    beside it (on the main process). A partial folder alone is resumed, and only by the run
    that made it (the fingerprint check)."""
    from gencraft.errors import ConfigError
    from gencraft.utils import world_rank

    output = Path(args.output)
    suffixes = getattr(args, "output_suffixes", None)
    if suffixes and output.suffix.lower() not in suffixes:
        raise ConfigError(
            f"--output {args.output}: this command writes {' or '.join(suffixes)} files, "
            f"not {output.suffix or 'a name without a suffix'}"
        )
    restart = getattr(args, "restart", False)
    if output.is_file() and not restart:
        raise ConfigError(
            f"--output {args.output} exists; add --restart to replace it, or give another file"
        )
    if restart and world_rank() == 0:
        import shutil

        shutil.rmtree(partial_folder(args.output), ignore_errors=True)


def output_fingerprint(
    model: object, name: str, inputs: object, settings: dict, seed: int | None = None
) -> dict:
    """What makes a file command's outputs, for its partial results
    (:func:`gencraft.distributed.map_sharded`): the model's name and weights, the inputs'
    content, every decoding setting and the seed."""
    from gencraft.models.introspect import weights_digest
    from gencraft.models.registry import canonical_name

    model_part = {"name": canonical_name(name), "weights": weights_digest(model)}
    return {"model": model_part, "inputs": inputs, "settings": settings, "seed": seed}


class JsonLines:
    """``--output FILE`` written one JSON line per finished item, flushed as it goes, so an
    interrupted run keeps what it made; without a file, the lines go to stdout at the end
    (``quiet_stdout``: not at all)."""

    def __init__(self, path: str | None) -> None:
        self.path = Path(path) if path else None
        self.lines: list[str] = []
        self._file = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("w", encoding="utf-8")

    def write(self, record: dict) -> None:
        import json

        line = json.dumps(record, ensure_ascii=False)  # text as written, not \u escapes
        self.lines.append(line)
        if self._file is not None:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def __enter__(self) -> JsonLines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def say(*parts: object) -> None:
    """``print`` on the main process only: one header, one summary under ``accelerate
    launch``."""
    from gencraft.utils import world_rank

    if world_rank() == 0:
        print(*parts, flush=True)


def batch_note(batch_size: int, grad_accum: int = 1) -> str:
    """The global batch in words: ``--batch-size`` is per process."""
    from gencraft.utils import world_size

    n = world_size()
    step = batch_size * grad_accum * n
    accum = f" x {grad_accum} accumulated" if grad_accum > 1 else ""
    return f"batch {batch_size} per process{accum} x {n} process(es) = {step} examples a step"


def task_fields(args: object, recorded: dict | None = None) -> dict[str, str]:
    """``source_field``/``target_field`` for a task given as a path: the flags, else the
    ones the run was trained with, else ``source``/``target``."""
    recorded = recorded or {}
    return {
        name: getattr(args, name, None) or recorded.get(name) or default
        for name, default in (("source_field", "source"), ("target_field", "target"))
    }


def recorded_data(run: str | None) -> dict:
    """What a trained run recorded of its data (its task, as a name or an absolute path, and
    the field names): the settings' ``train`` section for prefix and NAR runs, ``data`` for
    focus runs; empty for a model name or a folder saved outside a run."""
    if not run or not Path(run).is_dir():
        return {}
    from gencraft.errors import GencraftError
    from gencraft.training.run import model_directory, read_settings

    try:
        settings = read_settings(model_directory(run))
    except GencraftError:
        return {}  # loading the run says what is wrong with it
    return settings.get("data") or settings.get("train") or {}


def run_task(
    args: object, recorded: dict | None, default: str | None = None
) -> tuple[str, dict[str, str]]:
    """(task, field names) of an eval/generate command: ``--task`` when given, else the task
    the run was trained on (``recorded``: so a run on your own data evaluates on it without
    naming the path again), else ``default``. The recorded field names go with the recorded
    task only; another task takes the flags, or ``source``/``target``."""
    recorded = recorded or {}
    task = getattr(args, "task", None) or recorded.get("task") or default
    return task, task_fields(args, recorded if task == recorded.get("task") else None)


def use_run_task(args: object, run: str | None, default: str) -> None:
    """:func:`run_task` for the run at ``run`` (:func:`recorded_data`), set on ``args``."""
    args.task, fields = run_task(args, recorded_data(run), default)
    for name, value in fields.items():
        setattr(args, name, value)


#: the shared groups whose values every command checks right after parsing
CHECKED = (DataOptions, DecodeOptions)


def check_options(args: object) -> None:
    """Validate the shared option groups a command took (each group's ``__post_init__`` on
    the flags it has), so ``--num-beams 0`` or ``--limit -1`` is refused in one line before
    anything loads; likewise ``--device`` and ``--dtype`` (a missing CUDA, a misspelt device,
    float16 on a CPU)."""
    import dataclasses

    if hasattr(args, "device") or hasattr(args, "dtype"):
        from gencraft.models.placement import check_placement

        check_placement(getattr(args, "device", None), getattr(args, "dtype", None))

    for cls in CHECKED:
        names = {f.name for f in dataclasses.fields(cls)}
        given = {k: v for k, v in vars(args).items() if k in names}
        if given:
            cls(**given)
