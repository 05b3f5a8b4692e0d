"""Progress in log files: when stderr is not a terminal, bars become periodic
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


class _Tty(__import__("io").StringIO):
    def isatty(self) -> bool:
        return True


class _Closed(__import__("io").StringIO):
    def isatty(self) -> bool:
        raise ValueError("I/O operation on closed file")


def test_a_terminal_keeps_tqdms_redraws_and_immediate_postfix():
    tty = _Tty()
    bar = tqdm(total=3, file=tty, desc="t")
    assert not bar._plain
    before = tty.getvalue().count("\r")
    bar.set_postfix(loss=1.0)  # a terminal redraws at once
    bar.set_postfix_str("x=2")
    bar.set_description("u")
    assert tty.getvalue().count("\r") >= before + 3
    bar.close()


def test_a_stream_that_cannot_say_is_not_a_terminal():
    import io

    assert tqdm(total=1, file=_Closed())._plain
    assert tqdm(total=1, file=io.StringIO())._plain


def test_plain_lines_are_ascii_narrow_and_carry_every_update(monkeypatch):
    import io

    monkeypatch.setenv("GENCRAFT_PROGRESS_SECONDS", "1000")
    out = io.StringIO()
    bar = tqdm(total=50, file=out, desc="a")
    for _ in range(50):
        bar.set_description("train")
        bar.set_postfix_str("lr=0.1")
        bar.update(1)
    bar.close()
    lines = out.getvalue().splitlines()
    last = lines[-1]
    assert last.startswith("train:") and "lr=0.1" in last and "50/50" in last
    assert all(line.isascii() and len(line) <= 100 and line == line.strip() for line in lines)
    assert bar.maxinterval == 1000.0  # the longest silence: the period asked for


def test_a_negative_or_unreadable_period_falls_back_to_the_default(monkeypatch):
    import io

    for value in ("-5", "soon"):
        monkeypatch.setenv("GENCRAFT_PROGRESS_SECONDS", value)
        bar = tqdm(total=1, file=io.StringIO())
        assert (bar.mininterval, bar.maxinterval) == (30.0, 30.0)
    monkeypatch.setenv("GENCRAFT_PROGRESS_SECONDS", "0")  # a line per update, 10 s at most apart
    bar = tqdm(total=1, file=io.StringIO())
    assert (bar.mininterval, bar.maxinterval) == (0.0, 10.0)


def test_a_nested_bar_writes_no_cursor_moves_to_a_log(capsys, monkeypatch):
    """The pointer trainer's validation bar inside its epoch bar moved the cursor
    up (ESC [ A) in a log file; plain lines carry no control sequence."""
    monkeypatch.setenv("GENCRAFT_PROGRESS_SECONDS", "0")
    outer = tqdm(total=2, desc="epoch 1")
    for _ in range(2):
        inner = tqdm(total=3, desc="valid")
        for _ in range(3):
            inner.update(1)
        inner.close()
        outer.update(1)
    outer.close()
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\r" not in err
    assert "valid" in err and "epoch 1" in err
