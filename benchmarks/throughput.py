"""Batched decoders against their per-input loops and their peers (thin wrapper; the code is
gencraft.studies.throughput).

    python benchmarks/throughput.py run --threads 2             # the CPU table (docs/results)
    python benchmarks/throughput.py run --decoders beam exact --batch-sizes 1 8

The command is ``gencraft reproduce throughput --scale cpu`` with its settings as flags;
``--help`` lists them. On a GPU: ``gencraft reproduce throughput --scale gpu`` (bfloat16).
"""

from gencraft.studies.cli import benchmark_main

if __name__ == "__main__":
    benchmark_main(__doc__, {"run": "throughput"})
