"""Studies: what gencraft measures about the papers' claims, kept apart from the library.

- :mod:`gencraft.studies.claims`: every claim of the four works as a record (the paper's
  effect, the endpoint and its independent unit, the test, the scale gencraft measured it at,
  a confirmatory run's plan) and the one rule that gives its verdict.
- :mod:`gencraft.studies.rereads`: the readers that turn committed run files into paired
  comparisons on each claim's unit.

The library (``models``, ``training``, ``metrics``, ``data`` and the method packages) never
imports this package."""
