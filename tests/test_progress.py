"""Progress in log files (issue 32 §6): when stderr is not a terminal, bars become periodic
plain lines, never carriage-return redraws."""

from __future__ import annotations

from gencraft.progress import tqdm


def test_a_redirected_bar_prints_whole_lines(capsys, monkeypatch):
    monkeypatch.setenv("GENCRAFT_PROGRESS_SECONDS", "0")  # a line per update
    for _ in tqdm(range(20), desc="train"):
        pass
    err = capsys.readouterr().err  # pytest's capture is not a terminal
    assert "\r" not in err
    lines = err.splitlines()
    assert len(lines) >= 20 and all(line.startswith("train:") for line in lines)
    assert "20/20" in lines[-1]


def test_a_redirected_bar_is_periodic(capsys):
    """With the default period (30 s), a quick loop of 500 updates prints its first and
    last state only."""
    for _ in tqdm(range(500), desc="eval"):
        pass
    lines = capsys.readouterr().err.splitlines()
    assert 1 <= len(lines) <= 3 and "500/500" in lines[-1]


def test_a_closed_transient_bar_leaves_no_blank_lines(capsys, monkeypatch):
    monkeypatch.setenv("GENCRAFT_PROGRESS_SECONDS", "0")
    bar = tqdm(total=3, desc="windows", leave=False)
    bar.update(3)
    bar.close()
    assert all(line.strip() for line in capsys.readouterr().err.splitlines())
