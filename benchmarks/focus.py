"""FAME experiments (thin wrapper; the code is gencraft.studies.focus).

    python benchmarks/focus.py speed --model minilm-l6-bert2bert --threads 1 --rounds 7
    python benchmarks/focus.py quality --model minilm-l6-bert2bert --minutes 2.5 --seed 1

Each command is ``gencraft reproduce focus-NAME --scale cpu`` with its settings as flags;
``--help`` on a command lists them. Runs on the GPU when there is one (``--device``).
"""

from gencraft.studies.cli import benchmark_main

if __name__ == "__main__":
    benchmark_main(__doc__, {"speed": "focus-speed", "quality": "focus-quality"})
