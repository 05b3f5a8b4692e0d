"""Small corpora in the official formats, written where a test asks."""

from __future__ import annotations

from pathlib import Path


def write_wikitext(root: Path, sizes: list[int]) -> None:
    """A WikiText-format corpus whose test split has one article per entry of ``sizes`` (its
    paragraph count, at most 9 of at most 10), each with a section heading; train holds
    every word."""

    def article(i: int, paragraphs: int) -> list[str]:
        lines = [" ", f" = Title {i} = ", " "]
        for j in range(paragraphs):
            if j == 1:
                lines += [" = = Section = = ", " "]
            lines += [f" article {i} says thing {j} , and more @-@ words . ", " "]
        return lines

    (root / "wikitext-2").mkdir(parents=True, exist_ok=True)
    for split, arts in (("train", [9] * 10), ("valid", [2]), ("test", sizes)):
        lines = [x for i, n in enumerate(arts) for x in article(i, n)]
        (root / "wikitext-2" / f"wiki.{split}.tokens").write_text("\n".join(lines) + "\n")
