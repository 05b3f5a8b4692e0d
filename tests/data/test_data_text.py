"""Summarization and data-to-text loaders on fixtures in the official formats, and real data."""

import json
import random

import pytest

from gencraft.data import (
    linearize_e2e,
    linearize_triples,
    load_data_to_text,
    load_summarization,
    local_split,
    parse_e2e_mr,
)
from gencraft.errors import DataError


def _write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


@pytest.fixture
def xsum_dir(tmp_path):
    rows = [{"id": str(1000 + i), "document": f"doc {i}", "summary": f"sum {i}"} for i in range(50)]
    _write_jsonl(tmp_path / "xsum" / "xsum-50.jsonl", rows)
    return tmp_path


def test_local_split_is_a_deterministic_partition(xsum_dir):
    parts = {s: load_summarization("xsum", s, xsum_dir) for s in ("train", "validation", "test")}
    assert [len(parts[s]) for s in ("train", "validation", "test")] == [40, 5, 5]
    ids = [e.id for s in parts for e in parts[s]]
    assert sorted(ids) == sorted(str(1000 + i) for i in range(50))
    assert load_summarization("xsum", "valid", xsum_dir) == parts["validation"]
    assert len(load_summarization("xsum", "all", xsum_dir)) == 50
    # independent of file order: shuffle the lines and split again
    ids_in_order = [str(1000 + i) for i in range(50)]
    shuffled = ids_in_order[:]
    random.Random(0).shuffle(shuffled)
    for split in ("train", "validation", "test"):
        a = {ids_in_order[i] for i in local_split(ids_in_order, split)}
        b = {shuffled[i] for i in local_split(shuffled, split)}
        assert a == b


def test_official_split_files_are_used_as_is(tmp_path):
    for split in ("train", "validation", "test"):
        _write_jsonl(
            tmp_path / "cnndm" / f"{split}.jsonl",
            [{"id": f"{split}-0", "document": "d", "summary": "s"}],
        )
    assert [e.id for e in load_summarization("cnndm", "validation", tmp_path)] == ["validation-0"]
    with pytest.raises(DataError, match="official splits found"):
        load_summarization("cnndm", "all", tmp_path)


def test_malformed_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "xsum" / "bad.jsonl"
    path.parent.mkdir()
    path.write_text('{"id": "1", "document": "d", "summary": "s"}\n{"id": 2, "document": \n')
    with pytest.raises(DataError, match=r"bad\.jsonl, line 2: not JSON"):
        load_summarization("xsum", "all", tmp_path)
    path.write_text('{"id": "1", "document": "d"}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl, line 1: missing field\(s\) summary"):
        load_summarization("xsum", "all", tmp_path)
    with pytest.raises(DataError, match="unknown summarization dataset 'gigaword'"):
        load_summarization("gigaword", "test", tmp_path)


E2E_CSV = (
    "mr,ref\n"
    '"name[The Vaults], eatType[pub], priceRange[more than £30]","The Vaults is a pub, over £30."\n'
    '"name[The Vaults], eatType[pub], priceRange[more than £30]",The Vaults pub is pricey.\n'
    '"name[Blue Spice], area[city centre]",Blue Spice is in the centre.\n'
)


def test_e2e_groups_references_and_linearises(tmp_path):
    d = tmp_path / "e2e"
    d.mkdir()
    for name in ("trainset.csv", "devset.csv", "testset_w_refs.csv"):
        (d / name).write_text(E2E_CSV, encoding="utf-8")
    ex = load_data_to_text("e2e", "train", tmp_path)
    assert len(ex) == 2
    assert ex[0].input == "name : The Vaults | eatType : pub | priceRange : more than £30"
    assert ex[0].references == ["The Vaults is a pub, over £30.", "The Vaults pub is pricey."]
    assert ex[1].references == ["Blue Spice is in the centre."]
    assert parse_e2e_mr("near[Café Adriatic], food[Fast food]") == [
        ("near", "Café Adriatic"),
        ("food", "Fast food"),
    ]
    with pytest.raises(DataError, match="malformed E2E meaning representation"):
        linearize_e2e("name[unclosed")


WEBNLG_XML = """<?xml version="1.0" encoding="UTF-8"?>
<benchmark><entries>
  <entry category="Airport" eid="Id1" size="2">
    <originaltripleset><otriple>Aarhus | leaderName | Jacob_Bundsgaard</otriple></originaltripleset>
    <modifiedtripleset>
      <mtriple>Aarhus | leaderName | Jacob_Bundsgaard</mtriple>
      <mtriple>Aarhus_Airport | cityServed | Aarhus</mtriple>
    </modifiedtripleset>
    <lex comment="good" lid="Id1">Aarhus airport serves Aarhus, led by Jacob Bundsgaard.</lex>
    <lex comment="good" lid="Id2">Jacob Bundsgaard leads Aarhus, served by its airport.</lex>
  </entry>
  <entry category="Artist" eid="Id2" size="1">
    <modifiedtripleset><mtriple>Alan_Frew | genre | Rock_music</mtriple></modifiedtripleset>
    <lex comment="good" lid="Id1">Alan Frew plays rock music.</lex>
  </entry>
</entries></benchmark>
"""


def test_webnlg_multi_reference_entries(tmp_path):
    root = tmp_path / "webnlg"
    (root / "train" / "2triples").mkdir(parents=True)
    (root / "train" / "2triples" / "2triples_Airport_train_challenge.xml").write_text(WEBNLG_XML)
    (root / "test").mkdir()
    (root / "test" / "testdata_with_lex.xml").write_text(WEBNLG_XML)
    ex = load_data_to_text("webnlg", "train", tmp_path)
    assert len(ex) == 2
    assert (
        ex[0].input
        == "Aarhus : leaderName : Jacob Bundsgaard | Aarhus Airport : cityServed : Aarhus"
    )
    assert len(ex[0].references) == 2 and ex[0].meta["seen"] and not ex[1].meta["seen"]
    kept = load_data_to_text("webnlg", "test", tmp_path, underscores=True)
    assert kept[1].input == "Alan_Frew : genre : Rock_music"
    with pytest.raises(DataError, match="no validation XML files"):
        load_data_to_text("webnlg", "validation", tmp_path)


def test_dart_json_and_xml(tmp_path):
    d = tmp_path / "dart"
    d.mkdir()
    rows = [
        {
            "tripleset": [["Mars Hill College", "JOINED", "1973"]],
            "subtree_was_extended": False,
            "annotations": [
                {"source": "x", "text": "It joined in 1973."},
                {"source": "y", "text": "Joined 1973."},
            ],
        }
    ]
    (d / "dart-v1.1.1-full-dev.json").write_text(json.dumps(rows))
    (d / "dart-v1.1.1-full-test.xml").write_text(WEBNLG_XML)
    dev = load_data_to_text("dart", "validation", tmp_path)
    assert dev[0].input == "Mars Hill College : JOINED : 1973"
    assert dev[0].references == ["It joined in 1973.", "Joined 1973."]
    assert len(load_data_to_text("dart", "test", tmp_path)) == 2
    with pytest.raises(DataError, match=r"neither dart-v1\.1\.1-full-train\.json nor"):
        load_data_to_text("dart", "train", tmp_path)
    assert linearize_triples([("a_b", "p", "c")]) == "a b : p : c"


def test_real_text_datasets(shared_data):
    assert len(load_summarization("xsum", "test", shared_data)) == 100
    assert len(load_summarization("cnndm", "all", shared_data)) == 250
    counts = {
        ("e2e", "train"): (4862, 42061),
        ("e2e", "validation"): (547, 4672),
        ("e2e", "test"): (630, 4693),
        ("webnlg", "train"): (6940, 18102),
        ("webnlg", "validation"): (872, 2268),
        ("webnlg", "test"): (1862, 4928),
        ("dart", "validation"): (2768, 6980),
        ("dart", "test"): (5097, 12552),
    }
    for (name, split), (n, refs) in counts.items():
        ex = load_data_to_text(name, split, shared_data)
        assert (len(ex), sum(len(e.references) for e in ex)) == (n, refs), (name, split)


def test_a_local_split_keeps_file_order(xsum_dir):
    """The 80/10/10 split picks by hash but returns its examples in file order, so that
    ``--limit N`` takes the first N of the file that are in the split."""
    for split in ("train", "validation", "test"):
        got = [int(e.id) for e in load_summarization("xsum", split, xsum_dir)]
        assert got == sorted(got)
        assert local_split([str(1000 + i) for i in range(50)], split) == sorted(
            local_split([str(1000 + i) for i in range(50)], split)
        )
