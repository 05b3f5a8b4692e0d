"""A researcher's own data: task files (.jsonl/.csv/.tsv, or a folder of split
files) read against a reference grouping over drawn records, LM corpora as a text file or a
folder, and errors that name the file, the line and the field."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gencraft.data.lm import EOS, UNK, load_lm_corpus
from gencraft.data.tasks import task_examples, training_pairs
from gencraft.errors import DataError

TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Zl", "Zp")),
    min_size=1,
    max_size=12,
).filter(lambda s: s.strip() and s == s.strip())
SOURCES = st.lists(TEXT, min_size=1, max_size=4, unique=True)


def _reference(rows: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    """Grouped by source in order of first appearance, references in row order."""
    out: dict[str, list[str]] = {}
    for src, tgts in rows:
        out.setdefault(src, []).extend(tgts)
    return list(out.items())


def _write(path: Path, rows: list[tuple[str, list[str]]], fields=("source", "target")) -> None:
    if path.suffix == ".jsonl":
        lines = []
        for src, tgts in rows:
            tgt = tgts if len(tgts) > 1 else tgts[0]
            lines.append(json.dumps({fields[0]: src, fields[1]: tgt, "extra": 1}))
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter="\t" if path.suffix == ".tsv" else ",")
        w.writerow([fields[0], "extra", fields[1]])
        for src, tgts in rows:
            for t in tgts:  # several references: repeated rows
                w.writerow([src, "x", t])


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sources=SOURCES,
    picks=st.lists(
        st.tuples(st.integers(0, 3), st.lists(TEXT, min_size=1, max_size=3)), max_size=8
    ),
    suffix=st.sampled_from([".jsonl", ".csv", ".tsv"]),
    fields=st.sampled_from([("source", "target"), ("src", "tgt"), ("document", "summary")]),
)
def test_task_files_group_references_by_source_as_the_reference_does(
    tmp_path, sources, picks, suffix, fields
):
    rows = [(sources[i % len(sources)], tgts) for i, tgts in picks] or [(sources[0], ["x"])]
    path = tmp_path / f"data{suffix}"
    _write(path, rows, fields)
    kw = {"source_field": fields[0], "target_field": fields[1]}
    got = task_examples(str(path), "test", **kw)
    assert [(e.source, e.references) for e in got] == _reference(rows)
    # every split of a single file is the file; training pairs are one per reference
    assert [(e.source, e.references) for e in task_examples(str(path), "train", **kw)] == [
        (e.source, e.references) for e in got
    ]
    pairs = training_pairs(str(path), "train", **kw)
    assert [(p.source, p.target) for p in pairs] == [
        (s, t) for s, ts in _reference(rows) for t in ts
    ]


def test_a_folder_gives_each_split_its_own_file(tmp_path):
    (tmp_path / "train.jsonl").write_text(json.dumps({"source": "a", "target": "A"}) + "\n")
    _write(tmp_path / "dev.csv", [("b", ["B"])])
    _write(tmp_path / "test.tsv", [("c", ["C1", "C2"])])
    assert [e.source for e in task_examples(str(tmp_path), "train")] == ["a"]
    assert [e.source for e in task_examples(str(tmp_path), "validation")] == ["b"]
    assert [e.references for e in task_examples(str(tmp_path), "test")] == [["C1", "C2"]]
    e = task_examples(str(tmp_path), "test")[0]
    assert (e.input, e.document, e.summary) == ("c", "c", "C1")  # what every evaluator reads


@pytest.mark.parametrize(
    ("content", "suffix", "message"),
    [
        (
            '{"source": "a", "target": "b"}\n{"source": "a"}\n',
            ".jsonl",
            ", line 2: no field 'target'",
        ),
        ('{"source": "a", "target": "b"}\nnot json\n', ".jsonl", ", line 2: not JSON"),
        ('{"source": "", "target": "b"}\n', ".jsonl", ", line 1: field 'source' must be"),
        ('{"source": "a", "target": []}\n', ".jsonl", ", line 1: field 'target' must be"),
        ("[1, 2]\n", ".jsonl", ", line 1: expected a JSON object"),
        ("source,target\na,b\nc\n", ".csv", ", line 3: 1 cells but the header names 2"),
        ("source,target\na,b,c\n", ".csv", ", line 2: 3 cells but the header names 2"),
        ("", ".csv", "empty, or no header line"),
        ("a b\n", ".txt", "a task file is .jsonl, .csv or .tsv"),
    ],
)
def test_errors_name_the_file_line_and_field(tmp_path, content, suffix, message):
    path = tmp_path / f"mine{suffix}"
    path.write_text(content)
    with pytest.raises(DataError) as err:
        task_examples(str(path), "test")
    assert str(path) in str(err.value) and message in str(err.value)


def test_missing_paths_and_split_files_are_named(tmp_path):
    with pytest.raises(DataError, match="no such task file or folder"):
        task_examples(str(tmp_path / "nope.jsonl"), "test")
    (tmp_path / "train.jsonl").write_text('{"source": "a", "target": "b"}\n')
    with pytest.raises(DataError, match=r"no test file .*test\.jsonl"):
        task_examples(str(tmp_path), "test")
    with pytest.raises(DataError, match=r"no field 'tgt'.*--target-field"):
        task_examples(str(tmp_path), "train", target_field="tgt")


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    lines=st.lists(st.lists(st.sampled_from(list("abcdef")), max_size=6), min_size=1, max_size=6),
    folder=st.booleans(),
)
def test_own_corpora_count_words_like_the_named_ones(tmp_path, lines, folder):
    """Each line's words then <eos>; the vocabulary from train; a single file is every split."""
    lines = [*lines, ["a"]]  # at least one word
    text = "\n".join(" ".join(w) for w in lines) + "\n"
    if folder:
        root = tmp_path / f"corpus{len(lines)}"
        root.mkdir(exist_ok=True)
        for name in ("train", "valid", "test"):
            (root / f"{name}.txt").write_text(text)
        spec = str(root)
    else:
        spec = str(tmp_path / "corpus.txt")
        Path(spec).write_text(text)
    corpus = load_lm_corpus(spec, splits=("train", "valid", "test"))
    want = [t for line in lines for t in (*line, EOS)]
    for split in ("train", "valid", "test"):
        assert corpus.vocab.decode(corpus[split]) == want
    assert UNK in corpus.vocab.stoi  # words unseen in train map to <unk>


def test_own_corpus_unseen_words_become_unk_and_empty_splits_are_refused(tmp_path):
    for name, text in (("train", "a b\n"), ("valid", "a z\n"), ("test", "\n")):
        (tmp_path / f"{name}.txt").write_text(text)
    corpus = load_lm_corpus(str(tmp_path), splits=("valid",))
    assert corpus.vocab.decode(corpus["valid"]) == ["a", UNK, EOS]
    with pytest.raises(DataError, match=r"test\.txt: no words in it"):
        load_lm_corpus(str(tmp_path), splits=("test",))
    with pytest.raises(DataError, match="no such corpus file or folder"):
        load_lm_corpus(str(tmp_path / "missing.txt"))


@pytest.mark.parametrize("suffix", [".jsonl", ".tsv"])
@pytest.mark.parametrize("name", ["e2e", "xsum"])
def test_a_named_task_exported_reads_back_the_same(shared_data, tmp_path, name, suffix):
    from gencraft.cli.main import main
    from gencraft.data.tasks import references_of, source_of

    out = tmp_path / f"{name}{suffix}"
    argv = ["data", "export", name, "--split", "test", "--output", str(out)]
    assert main([*argv, "--data-dir", str(shared_data)]) == 0
    want = task_examples(name, "test", str(shared_data))
    got = task_examples(str(out), "test")
    key = [(source_of(e), references_of(e)) for e in want]
    if suffix == ".tsv":  # repeated rows are grouped by source text: merge duplicates alike
        merged: dict[str, list[str]] = {}
        for s, refs in key:
            merged.setdefault(s, []).extend(refs)
        key = list(merged.items())
    assert [(e.source, e.references) for e in got] == key


def test_a_named_corpus_exported_reads_back_the_same_words(shared_data, tmp_path):
    from gencraft.cli.main import main

    out = tmp_path / "ptb-valid.txt"
    argv = ["data", "export", "ptb", "--split", "valid", "--output", str(out)]
    assert main([*argv, "--data-dir", str(shared_data)]) == 0
    want = load_lm_corpus("ptb", str(shared_data), ("valid",))
    got = load_lm_corpus(str(out), splits=("valid",))
    assert got.vocab.decode(got["valid"]) == want.vocab.decode(want["valid"])


def test_mutmut_survivors_ids_blank_lines_list_sources_and_ambiguous_folders(tmp_path):
    """Gaps mutmut found in the first run over gencraft/data/own.py."""
    from gencraft.data.own import read_task_file

    path = tmp_path / "t.jsonl"
    rows = [{"id": "a1", "source": "s1", "target": "t1"}, {"source": "s2", "target": "t2"}]
    path.write_text(json.dumps(rows[0]) + "\n\n" + json.dumps(rows[1]) + "\n")  # a blank line
    got = read_task_file(path)  # default fields: source, target
    assert [(e.id, e.source, e.references) for e in got] == [
        ("a1", "s1", ["t1"]),
        ("1", "s2", ["t2"]),
    ]
    path.write_text(json.dumps({"source": ["a", "b"], "target": "t"}) + "\n")
    with pytest.raises(DataError, match="field 'source' must be non-empty text, got"):
        read_task_file(path)
    folder = tmp_path / "two"
    folder.mkdir()
    (folder / "test.jsonl").write_text(json.dumps(rows[1]) + "\n")
    (folder / "test.csv").write_text("source,target\ns,t\n")
    with pytest.raises(DataError, match=r"several test files \(test\.jsonl, test\.csv\)"):
        task_examples(str(folder), "test")


# -- what names a path (docs/datasets.md): the rule written out, against the code ------------
NAMES = ("e2e", "xsum")
SUFFIXES = (".jsonl", ".csv", ".tsv", ".txt")


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    stem=st.sampled_from(["e2e", "xsum", "mine", "my data", "E2E", "txt", "a.b"]),
    suffix=st.sampled_from(["", *SUFFIXES, ".TXT", ".json", ".txt.bak"]),
    folder=st.sampled_from(["", "sub/", "./", "~/"]),
    exists=st.booleans(),
)
@example(stem="corpus", suffix=".txt", folder="", exists=False)  # a suffix alone makes a path
@example(stem="e2e", suffix="", folder="", exists=True)  # a name, even beside such a file
@example(stem="mine", suffix="", folder="", exists=False)  # neither
def test_what_names_a_path_follows_the_documented_rule(tmp_path, stem, suffix, folder, exists):
    import os

    from gencraft.data.own import canonical_spec, is_path_spec, spec_name

    spec = f"{folder}{stem}{suffix}"
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        if exists and not folder.startswith("~"):
            Path(spec).parent.mkdir(parents=True, exist_ok=True)
            Path(spec).touch()
        # a path: not a dataset name, and it exists, holds a separator or ends with a data suffix
        want = spec not in NAMES and (Path(spec).exists() or "/" in spec or spec.endswith(SUFFIXES))
        assert is_path_spec(spec, NAMES) == want
        got = canonical_spec(spec, NAMES)
        if want:  # recorded absolute, so the run evaluates from any folder
            assert got == str(Path(spec).expanduser().resolve()) and Path(got).is_absolute()
        else:
            assert got == spec
    finally:
        os.chdir(cwd)
    # a default output folder's name: the last part, less a data suffix
    last = Path(spec).name
    assert spec_name(spec) == (last[: -len(suffix)] if suffix in SUFFIXES else last)


def test_default_fields_empty_files_and_flag_names_in_messages(tmp_path):
    from gencraft.data.own import corpus_files, load_task_path

    path = tmp_path / "t.jsonl"
    path.write_text('{"source": "a b", "target": "c"}\n')
    assert [(e.source, e.references) for e in load_task_path(str(path), "train")] == [
        ("a b", ["c"])
    ]  # source/target by default
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match=r"empty\.jsonl: no examples"):
        load_task_path(str(tmp_path / "empty.jsonl"), "train")
    path.write_text('{"src": "a", "target": "c"}\n')
    with pytest.raises(
        DataError, match=r"no field 'source' \(fields: src, target\).*--source-field"
    ):
        load_task_path(str(path), "train")
    path.write_text('{"source": "a", "target": 3}\n')
    with pytest.raises(DataError, match=r"non-empty text or a list of texts, got 3"):
        load_task_path(str(path), "train")
    (tmp_path / "t.xml").write_text("<a/>")
    with pytest.raises(DataError, match=r"not \.xml"):
        load_task_path(str(tmp_path / "t.xml"), "train")
    folder = tmp_path / "f"
    folder.mkdir()
    with pytest.raises(
        DataError, match=r"no validation file for a task \(looked for valid\.jsonl, "
    ):
        load_task_path(str(folder), "validation")
    with pytest.raises(DataError, match=r"no test file for a corpus \(looked for test\.txt"):
        corpus_files(str(folder), ("test",))


def test_own_task_takes_a_name_or_a_path_and_refuses_anything_else(tmp_path, monkeypatch):
    """It moved to gencraft.data.own: a known name stays, a path to own data is
    recorded absolute, anything else is one line naming both kinds."""
    from gencraft.data.own import own_task
    from gencraft.errors import ConfigError

    assert own_task("e2e", ("e2e", "dart")) == "e2e"
    (tmp_path / "mine.jsonl").write_text('{"source": "a", "target": "b"}\n')
    monkeypatch.chdir(tmp_path)
    assert own_task("mine.jsonl", ("e2e",)) == str(tmp_path / "mine.jsonl")
    with pytest.raises(ConfigError, match=r"task must be one of e2e, dart or a path .* got 'e3e'"):
        own_task("e3e", ("e2e", "dart"))
    with pytest.raises(ConfigError, match=r"corpus must be one of ptb or a path .*a text file"):
        own_task("wiki", ("ptb",), "corpus")


def test_a_corpus_is_tokenised_once_until_its_files_change(tmp_path, monkeypatch):
    """A second load of the same unchanged files reuses the tokenised corpus (equal to a
    fresh load, in new containers); a rewritten file, other splits or another path load
    again."""
    import os

    import gencraft.data.lm as lm

    folder = tmp_path / "c"
    folder.mkdir()
    for split, text in (("train", "a b c\nb c\n"), ("valid", "a z\n"), ("test", "c c\n")):
        (folder / f"{split}.txt").write_text(text)
    calls = []
    real = lm._tokenise
    monkeypatch.setattr(lm, "_tokenise", lambda *a: calls.append(a[2]) or real(*a))
    first = load_lm_corpus(str(folder))
    again = load_lm_corpus(str(folder))
    assert len(calls) == 1 and again is not first and again.splits is not first.splits
    assert again.vocab.itos == first.vocab.itos
    assert all(again[s].tolist() == first[s].tolist() for s in ("train", "valid", "test"))
    again.splits.pop("test")  # a caller's changes stay with its copy
    assert load_lm_corpus(str(folder))["test"].tolist() == first["test"].tolist()
    assert len(calls) == 1
    assert list(load_lm_corpus(str(folder), splits=("valid",)).splits) == ["valid"]
    both = load_lm_corpus(str(folder), splits=("train", "valid"))  # the same files read
    assert list(both.splits) == ["train", "valid"] and len(calls) == 3
    (folder / "valid.txt").write_text("a b\nzz\n")
    st = (folder / "train.txt").stat()
    os.utime(folder / "valid.txt", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    changed = load_lm_corpus(str(folder))
    assert len(calls) == 4 and changed["valid"].tolist() != first["valid"].tolist()
    assert changed.text("valid", detokenize=False) == f"a b\n{UNK}"  # zz: unseen in train


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ({"source": "   ", "target": "t"}, "source"),
        ({"source": "s", "target": "\t\n"}, "target"),
        ({"source": "s", "target": ["fine", "  "]}, "target"),
        ({"source": "s", "target": []}, "target"),
    ],
)
def test_whitespace_only_or_missing_texts_are_refused_naming_line_and_field(tmp_path, row, field):
    from gencraft.data.own import read_task_file

    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"source": "a", "target": "b"}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DataError, match=rf"t\.jsonl, line 2: field '{field}' must be non-empty"):
        read_task_file(path)
