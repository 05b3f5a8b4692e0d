"""Dependencies a user can install beside their own stack: ranges, never exact pins; a core of
seven packages; everything else an extra whose absence ends in one line naming its pip
command."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from gencraft.extras import EXTRAS, MissingExtraError, require

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
CORE = {"torch", "transformers", "accelerate", "safetensors", "tokenizers", "numpy", "tqdm"}
OPTIONAL = sorted({m for mods in EXTRAS.values() for m in mods})


def _name(req: str) -> str:
    return re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].lower()


def test_runtime_dependencies_are_ranges_over_the_core_only():
    deps = PYPROJECT["project"]["dependencies"]
    assert not [d for d in deps if "==" in d]
    assert {_name(d) for d in deps} == CORE
    assert all(re.search(r">=\s*\d", d) for d in deps), "every dependency has a tested floor"


def test_every_extra_of_the_code_is_an_extra_of_the_package():
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert set(EXTRAS) <= set(extras)
    for deps in extras.values():
        assert not [d for d in deps if "==" in d]
    everything = " ".join(extras["all"])
    for name in set(EXTRAS) - {"hub-data"}:
        assert name in everything


def test_the_constraints_files_pin_what_they_test():
    for name in ("ci", "newest", "floors"):
        text = (ROOT / "constraints" / f"{name}.txt").read_text()
        pins = dict(
            line.split("==", 1) for line in text.splitlines() if "==" in line and line[0] != "#"
        )
        assert {"torch", "transformers", "accelerate", "peft"} <= set(pins), name


def test_a_missing_extra_names_its_pip_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "sacrebleu", None)
    with pytest.raises(MissingExtraError, match=r"BLEU needs .*pip install 'gencraft\[metrics\]'"):
        require("sacrebleu", "metrics", "BLEU")
    from gencraft.metrics import bleu

    with pytest.raises(MissingExtraError, match=r"gencraft\[metrics\]"):
        bleu(["a b"], ["a b"])


def test_the_core_imports_and_runs_without_any_extra():
    """Every method package imports, a tiny model loads and a method runs with all optional
    packages blocked; the CLI answers --help."""
    code = f"""
import sys
BLOCKED = {OPTIONAL!r}
for name in BLOCKED:  # `import name` raises ImportError, find_spec(name) gives None
    sys.modules[name] = None
import gencraft.focus, gencraft.pointer, gencraft.search, gencraft.prefix
import gencraft.recurrence, gencraft.hso, gencraft.nar, gencraft.metrics, gencraft.cli.main
import torch
from gencraft.models import load_model
from gencraft.prefix import PrefixConfig, PrefixModel
model, _ = load_model("tiny-llama")
out = PrefixModel(model, PrefixConfig(num_virtual_tokens=2))(torch.tensor([[5, 6, 7]]))
loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED and sys.modules[m])
print(loaded)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1].replace("'", '"')) == []


def test_the_cli_names_a_missing_extra_in_one_line(tmp_path):
    preds, refs = tmp_path / "p.txt", tmp_path / "r.txt"
    preds.write_text("a cat sat\n")
    refs.write_text("a cat sat\n")
    code = (
        "import sys\nsys.modules['sacrebleu'] = None\n"
        "from gencraft.cli.main import main\n"
        f"sys.exit(main(['eval', '--predictions', {str(preds)!r}, '--references', "
        f"{str(refs)!r}, '--metrics', 'bleu']))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'gencraft[metrics]'" in lines[0], r.stderr
