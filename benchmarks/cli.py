"""How long the CLI takes to answer: ``gencraft --help`` and a mistyped flag against
``python -c pass`` and ``python -c "import torch"``, all timed in the same run.

    python benchmarks/cli.py --runs 7

Prints the median wall time of each command and its ratio to ``python -c pass``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    'python -c "import torch"': [sys.executable, "-c", "import torch"],
    "gencraft --help": [sys.executable, "-m", "gencraft", "--help"],
    "gencraft prefix train --lrr 1 (mistyped)": [
        *(sys.executable, "-m", "gencraft", "prefix", "train", "--model", "x", "--lrr", "1"),
    ],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="timed runs per command")
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.runs + 1):  # round-robin, so drift in the machine's load is shared
        for name, argv in COMMANDS.items():
            start = time.perf_counter()
            subprocess.run(argv, capture_output=True, check=False)
            times[name].append(time.perf_counter() - start)
    base = statistics.median(times["python -c pass"][1:])
    print(f"{'command':45s} {'median s':>9s} {'x python -c pass':>17s}")
    for name, runs in times.items():
        median = statistics.median(runs[1:])  # the first round warms the file cache
        print(f"{name:45s} {median:9.3f} {median / base:17.1f}")


if __name__ == "__main__":
    main()
