"""The package rules of docs/core.md, read off the source: no method package imports another,
and no two gencraft modules import each other, directly or through others (imports inside
functions count: they are the same design dependency)."""

from __future__ import annotations

import ast
from pathlib import Path

import gencraft

# the package imported (a mutation run imports a mutated copy, not the checkout)
PACKAGE = Path(gencraft.__file__).resolve().parent
METHODS = ("focus", "pointer", "search", "prefix", "recurrence", "hso", "nar")


def _modules() -> dict[str, Path]:
    out = {}
    for f in PACKAGE.rglob("*.py"):
        parts = f.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the gencraft modules it imports (``from a.b import c`` counts ``a.b.c`` when
    that is a module, else ``a.b``)."""
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, f in mods.items():
        package = name if f.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    deps.add(full if full in mods else base)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
            elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "lazy_exports":
                # a package's lazy exports: {module: names}, imported on first use
                deps.update(k.value for k in node.args[1].keys if isinstance(k, ast.Constant))
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _method(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in METHODS else None


def test_no_method_package_imports_another():
    crossing = [
        f"{m} -> {d}"
        for m, deps in import_graph().items()
        for d in deps
        if _method(m) and _method(d) and _method(m) != _method(d)
    ]
    assert crossing == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_the_checks_see_a_cycle_and_a_crossing():
    graph = {"gencraft.hso.a": {"gencraft.recurrence.b"}, "gencraft.recurrence.b": set()}
    assert _method("gencraft.hso.a") != _method("gencraft.recurrence.b")
    graph["gencraft.recurrence.b"] = {"gencraft.recurrence.c"}
    graph["gencraft.recurrence.c"] = {"gencraft.recurrence.b"}
    assert cycles(graph) == [["gencraft.recurrence.b", "gencraft.recurrence.c"]]
    assert "gencraft.metrics.lm" in import_graph()["gencraft.metrics"]


#: docs/core.md's "Method layout": the standard files each method package has (where they
#: apply; a method without a wrapper of its own has no model.py, one without a training
#: loop no train.py).
LAYOUT = {
    "focus": {"config", "functional", "model", "train", "evaluate"},
    "pointer": {"config", "functional", "train", "evaluate"},
    "search": {"config", "train"},
    "prefix": {"config", "functional", "model", "train", "evaluate"},
    "recurrence": {"config", "model", "train", "evaluate"},
    "hso": {"config", "functional"},
    "nar": {"config", "functional", "model", "train", "evaluate"},
}
#: the old names of the standard files, gone for good (a method's experiments are studies now)
OLD_NAMES = {"topic", "mixture", "objectives", "optimize", "train_classifier", "stepper"}
OLD_NAMES |= {"experiments"}


def test_every_method_package_has_the_standard_files():
    for method, files in LAYOUT.items():
        present = {f.stem for f in (PACKAGE / method).glob("*.py")}
        assert files <= present, (method, sorted(files - present))
        assert not present & OLD_NAMES, (method, sorted(present & OLD_NAMES))


def test_settings_classes_live_in_config_py():
    """Every ``...Config`` class of a method package (its settings, training and decoding
    included) is defined in its config.py."""
    elsewhere = []
    for method in METHODS:
        for f in (PACKAGE / method).glob("*.py"):
            for node in ast.parse(f.read_text()).body:
                is_config = isinstance(node, ast.ClassDef) and node.name.endswith("Config")
                if is_config and f.name != "config.py":
                    elsewhere.append(f"{method}/{f.name}: {node.name}")
    assert elsewhere == []


def test_train_py_holds_no_settings_of_fit():
    """train.py passes the settings class's own ``fit`` to ``fit``: no trainer maps fields into
    a FitConfig by hand (five copies once)."""
    by_hand = [
        f"{method}/train.py"
        for method in METHODS
        if (PACKAGE / method / "train.py").is_file()
        and "FitConfig(" in (PACKAGE / method / "train.py").read_text()
    ]
    assert by_hand == []


#: docs/core.md's style rule: a function, from its ``def`` line to its last (docstring
#: included; decorators, which hold an experiment's registration tables, not), at most this long
MAX_FUNCTION_LINES = 60


def long_functions(source: str, name: str) -> list[str]:
    """``name:function (lines)`` for each function of ``source`` longer than the rule."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                out.append(f"{name}:{node.name} ({lines})")
    return out


def test_functions_stay_under_sixty_lines():
    found = []
    for f in sorted(PACKAGE.rglob("*.py")):
        found += long_functions(f.read_text(), str(f.relative_to(PACKAGE)))
    assert found == []


def test_the_length_check_sees_a_long_function():
    body = "".join(f"    x{i} = {i}\n" for i in range(59))
    assert long_functions(f"@decorated(\n    1,\n)\ndef f():\n{body}", "m") == []  # 60
    assert long_functions(f"def f():\n{body}    y = 1\n", "m") == ["m:f (61)"]
    inner = body.replace("    x", "        x") + "        y = 1\n"
    assert long_functions(f"class C:\n    async def g(self):\n{inner}", "m") == ["m:g (61)"]


#: what may import the studies: the studies themselves, the command line and ``python -m``
NOT_LIBRARY = ("studies", "cli", "__main__")


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def studies_reached(graph: dict[str, set[str]]) -> list[str]:
    """``module -> import`` for each import of ``gencraft.studies`` by a library module (every
    module of the package but the studies, the CLI and ``__main__``)."""
    return [
        f"{m} -> {d}"
        for m, deps in graph.items()
        for d in deps
        if not any(_in(m, f"gencraft.{p}") for p in NOT_LIBRARY) and _in(d, "gencraft.studies")
    ]


def test_the_library_imports_nothing_of_the_studies():
    """The methods and the shared core know nothing of experiments: no module of theirs
    imports ``gencraft.studies`` (the CLI and the studies themselves may)."""
    assert studies_reached(import_graph()) == []
    fake = {
        "gencraft.models.x": {"gencraft.studies.claims", "gencraft.metrics"},
        "gencraft.cli.y": {"gencraft.studies"},
        "gencraft.hso.z": {"gencraft.studiesque"},
        "gencraft.progress": {"gencraft.studies"},
        "gencraft.studies.runner": {"gencraft.studies.timing"},
    }
    assert studies_reached(fake) == [
        "gencraft.models.x -> gencraft.studies.claims",
        "gencraft.progress -> gencraft.studies",
    ]


#: the experiment machinery, moved into gencraft.studies: no such module left outside it
MACHINERY = {"experiments", "experiment_shards", "campaign", "payload", "comparisons"}
MACHINERY |= {"throughput", "timing", "folder_lock", "reproduce"}


def test_the_experiment_machinery_lives_in_the_studies():
    outside = [
        str(f.relative_to(PACKAGE))
        for f in PACKAGE.rglob("*.py")
        if f.stem in MACHINERY and f.parent.name not in {"studies", "training"}
    ]
    assert outside == []
    assert (PACKAGE / "training" / "folder_lock.py").is_file()  # fit holds its output folder


#: the shared core's layers, lowest first: a package imports only those before it
CORE_LAYERS = ("models", "data", "training", "metrics")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """``a -> b`` for each import from a core package to one of a higher layer."""
    rank = {p: i for i, p in enumerate(CORE_LAYERS)}

    def pkg(module: str) -> str:
        return module.split(".")[1] if module.count(".") else ""

    return sorted(
        f"{m} -> {d}"
        for m, deps in graph.items()
        for d in deps
        if pkg(m) in rank and pkg(d) in rank and rank[pkg(d)] > rank[pkg(m)]
    )


def test_the_shared_core_imports_downward_only():
    """models (the bottom) imports none of data, training or metrics; MBR decoding, which
    needs the metrics' utilities, lives above them (gencraft.search.mbr)."""
    assert upward_imports(import_graph()) == []
    fake = {"gencraft.models.generate": {"gencraft.metrics.mbr", "gencraft.models.x"}}
    fake["gencraft.metrics.lm"] = {"gencraft.models.introspect"}
    assert upward_imports(fake) == ["gencraft.models.generate -> gencraft.metrics.mbr"]
