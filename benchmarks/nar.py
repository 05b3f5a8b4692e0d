"""NAR experiments (thin wrapper; the code is gencraft.studies.nar).

    python benchmarks/nar.py speed --inputs 8 --rounds 5 --threads 2
    python benchmarks/nar.py tasks --task e2e

Each command is ``gencraft reproduce nar-NAME --scale cpu`` with its settings as flags.
"""

from gencraft.studies.cli import benchmark_main

if __name__ == "__main__":
    benchmark_main(__doc__, {"speed": "nar-speed", "tasks": "nar-tasks"})
