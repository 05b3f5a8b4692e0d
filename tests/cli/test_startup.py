"""The CLI answers at once: parsing, ``--help`` and argument errors import
neither torch nor transformers; only the command that runs imports what it needs."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "transformers", "accelerate", "numpy", "matplotlib")

# every --help and a mistyped flag, in one fresh interpreter; prints the heavy modules loaded
PROBE = """
import argparse, contextlib, io, json, sys
from gencraft.cli.main import build_parser, main

def helps(parser, prefix):
    yield [*prefix, "--help"]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from helps(sub, [*prefix, name])

argvs = list(helps(build_parser(), []))
argvs += [["prefix", "train", "--model", "x", "--lrr", "1"], ["nar", "eval", "--num-beams", "x"]]
codes = []
for argv in argvs:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            codes.append(main(argv))
        except SystemExit as err:
            codes.append(err.code)
heavy = [m for m in %r if m in sys.modules]
print(json.dumps({"argvs": len(argvs), "codes": codes, "heavy": heavy}))
"""


def test_help_and_argument_errors_import_no_heavy_module():
    out = subprocess.run(
        [sys.executable, "-c", PROBE % (HEAVY,)], capture_output=True, text=True, check=True
    )
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["argvs"] > 30  # every command group and subcommand was asked for its help
    assert result["codes"][-2:] == [2, 2]  # the two mistyped commands were refused
    assert result["heavy"] == []


def test_method_packages_import_their_parts_on_first_use():
    """``from gencraft.prefix import PrefixModel`` still works; the config alone stays light."""
    code = (
        "import sys; import gencraft.prefix as p; from gencraft.prefix.config import PrefixConfig;"
        "light = 'torch' not in sys.modules; listed = 'PrefixModel' in dir(p);"
        "from gencraft.prefix import PrefixModel;"
        "print(light, listed, 'torch' in sys.modules, p.PrefixModel is PrefixModel)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True", "True", "True"]
