"""The option groups every command shares, as dataclasses (one name per concept across all
commands). A command adds the fields that apply to it with
``add_dataclass_arguments(parser, RunOptions, only=(...), defaults={...})``; old spellings
stay accepted as hidden aliases for one release (``--beams``, ``--data``, ``--max-train``,
``--max-valid``, nar eval's ``--predictions``)."""

from __future__ import annotations

from dataclasses import dataclass

from gencraft.config import REQUIRED, option, positive


@dataclass
class RunOptions:
    """Where a command writes and how it runs."""

    output: str | None = option(
        None,
        "where the results go (a training run resumes there)",
        aliases=("--output-dir", "--predictions"),
    )
    restart: bool = option(False, "start over: clear an earlier run in --output, not resume it")
    quiet: bool = option(False, "no progress bars")
    seed: int = option(0, "seed of every random draw")
    device: str | None = option(None, "cpu, cuda or cuda:N (default: cuda when there is one)")
    json: bool = option(False, "print JSON instead of a table")


@dataclass
class DataOptions:
    """Which data a command reads."""

    data_dir: str | None = option(
        None, "directory holding the dataset folders (default: $GENCRAFT_DATA_DIR)"
    )
    task: str | None = option(
        None, "dataset (default: the one the run was trained on)", aliases=("--data",)
    )
    corpus: str | None = option(None, "LM corpus (default: the one the run was trained on)")
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


#: the shared groups whose values every command checks right after parsing
CHECKED = (DataOptions, DecodeOptions)


def check_options(args: object) -> None:
    """Validate the shared option groups a command took (each group's ``__post_init__`` on
    the flags it has), so ``--num-beams 0`` or ``--limit -1`` is refused in one line before
    anything loads."""
    import dataclasses

    for cls in CHECKED:
        names = {f.name for f in dataclasses.fields(cls)}
        given = {k: v for k, v in vars(args).items() if k in names}
        if given:
            cls(**given)
