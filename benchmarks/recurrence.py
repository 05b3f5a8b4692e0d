"""Recurrence experiments (thin wrapper; the code is gencraft.studies.recurrence).

    python benchmarks/recurrence.py speed --model smollm2-135m --window 128 --threads 2
    python benchmarks/recurrence.py lm --max-steps 200

Each command is ``gencraft reproduce recurrence-NAME --scale cpu`` with its settings as flags.
HSO's and dynamic evaluation's cost per token is part of ``gencraft reproduce hso-lm``.
"""

from gencraft.studies.cli import benchmark_main

if __name__ == "__main__":
    benchmark_main(__doc__, {"speed": "recurrence-speed", "lm": "recurrence-lm"})
