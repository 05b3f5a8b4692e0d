"""Plain LSTM vs pointer sentinel-LSTM of the same size, under the same time budget (thin
wrapper; the code is gencraft.studies.pointer).

    python benchmarks/pointer.py --corpus ptb --minutes 20 --threads 1   # docs/results.md
    python benchmarks/pointer.py --corpus ptb --minutes 1 --threads 2    # a quick look

The command is ``gencraft reproduce pointer-vs-lstm --scale cpu`` with its settings as flags.
"""

from gencraft.studies.cli import benchmark_main

if __name__ == "__main__":
    benchmark_main(__doc__, {"run": "pointer-vs-lstm"})
