"""DASP experiments (thin wrapper; the code is gencraft.studies.prefix).

    python benchmarks/prefix.py speed --model smollm2-135m --threads 1 --rounds 7
    python benchmarks/prefix.py speed --model tiny-llama --rounds 3      # seconds, any machine
    python benchmarks/prefix.py tasks --task e2e --variants dense,hierblock

Each command is ``gencraft reproduce prefix-NAME --scale cpu`` with its settings as flags;
``--help`` on a command lists them. ``speed`` times every variant against peft's prefix-tuning
interleaved in one process (median of per-round ratios, with their quartiles).
"""

from gencraft.studies.cli import benchmark_main

if __name__ == "__main__":
    benchmark_main(__doc__, {"speed": "prefix-speed", "tasks": "prefix-tasks"})
