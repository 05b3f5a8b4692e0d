"""Search experiments (thin wrapper; the code is gencraft.studies.search_*).

    python benchmarks/search.py speed --prompts 8 --rounds 3 --new-tokens 32 --threads 1
    python benchmarks/search.py cad-speed --prompts 8 --rounds 3 --new-tokens 32 --threads 1
    python benchmarks/search.py memory --depths 16 64 256 --threads 1
    python benchmarks/search.py empty --prompts 40 --words 25 50 100 200 --max-nodes 200
    python benchmarks/search.py conditional --train-prompts 120 --threads 1

Each command is ``gencraft reproduce search-NAME --scale cpu`` with its settings as flags
(defaults: the documented CPU run); ``--help`` on a command lists them.
"""

from gencraft.studies.cli import benchmark_main

if __name__ == "__main__":
    benchmark_main(
        __doc__,
        {
            "speed": "search-speed",
            "cad-speed": "search-cad-speed",
            "memory": "search-memory",
            "empty": "search-empty",
            "conditional": "search-conditional",
        },
    )
