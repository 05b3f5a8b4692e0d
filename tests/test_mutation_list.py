"""``.ci/mutations.py`` stays in step with the source: every mutation's pattern occurs exactly
once in its file, so a refactor that moves the code shows up here, in the suite, and not only
when CI's rotating subset happens to pick the stale entry."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIST = ROOT / ".ci" / "mutations.py"


def _mutations() -> list[tuple[str, str, str, str, str]]:
    spec = importlib.util.spec_from_file_location("gencraft_ci_mutations", LIST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.M)


@pytest.mark.skipif(not LIST.is_file(), reason="no .ci/mutations.py (an installed package)")
def test_every_mutation_pattern_occurs_once_in_its_file():
    stale = []
    for name, path, pattern, replacement, _ in _mutations():
        count = (ROOT / path).read_text().count(pattern)
        if count != 1 or pattern == replacement:
            stale.append(f"{name!r} ({path}): the pattern occurs {count} times")
    assert not stale, "stale mutations:\n" + "\n".join(stale)


@pytest.mark.skipif(not LIST.is_file(), reason="no .ci/mutations.py (an installed package)")
def test_every_mutation_has_its_own_name():
    """CI reports and reruns mutations by name: two entries with one name hide each other."""
    names = [m[0] for m in _mutations()]
    assert sorted({n for n in names if names.count(n) > 1}) == []
