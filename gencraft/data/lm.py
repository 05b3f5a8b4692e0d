"""Word-level language-modelling corpora: WikiText-2, WikiText-103, Penn Treebank.

Built the way the Pointer Sentinel paper (Merity et al. 2016, Table 1) counts them: each line
of the official ``.tokens``/``.txt`` files is split on whitespace and followed by one
``<eos>``; ``<unk>`` is an ordinary vocabulary entry. The vocabulary is built from the
training split, ordered by decreasing training frequency (ties by first occurrence).

Checked statistics (``gencraft data stats``): WikiText-2 train/valid/test 2,088,628 /
217,646 / 245,569 tokens, vocab 33,278; PTB train 929,589, vocab 10,000. The paper's Table 1
lists PTB counts one higher (929,590 / 73,761 / 82,431) than the official files give.
"""

from __future__ import annotations

import bisect
import os
import re
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gencraft.data.io import normalize_split
from gencraft.data.sources import dataset_dir
from gencraft.errors import DataError

EOS, UNK = "<eos>", "<unk>"
LM_CORPORA = ("wikitext-2", "wikitext-103", "ptb")
LM_SPLITS = ("train", "valid", "test")
_FILES = {
    "wikitext-2": "wiki.{split}.tokens",
    "wikitext-103": "wiki.{split}.tokens",
    "ptb": "ptb.{split}.txt",
}
_ARTICLE_TITLE = re.compile(r"^ = [^=].* = $")


@dataclass
class Vocabulary:
    """Word <-> id map. ``counts[i]`` is the training-set frequency of word ``itos[i]``."""

    itos: list[str]
    counts: list[int]
    stoi: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.stoi = {w: i for i, w in enumerate(self.itos)}

    @classmethod
    def build(cls, tokens: list[str]) -> Vocabulary:
        """Vocabulary of ``tokens`` by decreasing frequency, ties broken by first occurrence."""
        counter = Counter(tokens)  # insertion order = first occurrence
        ordered = sorted(counter.items(), key=lambda kv: -kv[1])  # stable sort
        return cls([w for w, _ in ordered], [c for _, c in ordered])

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, tokens: list[str]) -> torch.Tensor:
        """Ids of ``tokens`` (LongTensor [N]); unseen words map to ``<unk>`` when it exists."""
        unk = self.stoi.get(UNK)
        try:
            ids = (
                [self.stoi[t] for t in tokens]
                if unk is None
                else [self.stoi.get(t, unk) for t in tokens]
            )
        except KeyError as err:
            raise DataError(
                f"word {err.args[0]!r} is not in the vocabulary and the corpus has no {UNK} token"
            ) from err
        return torch.tensor(ids, dtype=torch.long)

    def decode(self, ids: torch.Tensor | list[int]) -> list[str]:
        """Words of ``ids`` ([N])."""
        return [self.itos[int(i)] for i in ids]


@dataclass
class LMCorpus:
    """A tokenised corpus: ``splits[name]`` is a LongTensor [N] of word ids (with ``<eos>``)."""

    name: str
    vocab: Vocabulary
    splits: dict[str, torch.Tensor]
    lines: dict[str, list[str]] = field(repr=False)

    def __getitem__(self, split: str) -> torch.Tensor:
        return self.splits[normalize_split(split, LM_SPLITS)]

    def text(self, split: str, max_tokens: int | None = None, detokenize: bool = True) -> str:
        """The first ``max_tokens`` word tokens of ``split`` as text: ``<eos>`` becomes a newline;
        with ``detokenize``, :func:`wikitext_detokenize` restores natural spacing (for subword
        LMs). ``<unk>`` stays as written."""
        ids = self[split] if max_tokens is None else self[split][:max_tokens]
        lines, line = [], []
        for word in self.vocab.decode(ids):
            if word == EOS:
                lines.append(" ".join(line))
                line = []
            else:
                line.append(word)
        text = "\n".join([*lines, " ".join(line)] if line else lines)
        return wikitext_detokenize(text) if detokenize else text

    def stats(self) -> dict[str, dict[str, float | int | None]]:
        """Table-1 statistics per split: articles (WikiText), tokens, vocab size, OoV rate
        (share of tokens that are ``<unk>``, in %)."""
        unk = self.vocab.stoi.get(UNK)
        out: dict[str, dict[str, float | int | None]] = {}
        for split, ids in self.splits.items():
            n = int(ids.numel())
            articles = (
                _count_articles(self.lines[split]) if self.name.startswith("wikitext") else None
            )
            oov = 100.0 * int((ids == unk).sum()) / max(n, 1) if unk is not None else 0.0
            out[split] = {
                "articles": articles,
                "tokens": n,
                "vocab": len(self.vocab),
                "oov_rate": round(oov, 2),
            }
        return out


def _count_articles(lines: list[str]) -> int:
    return len(article_title_lines(lines))


def article_title_lines(lines: list[str]) -> list[int]:
    """The indices of WikiText's article titles among ``lines``: `` = Title = `` between two
    blank lines (table rows such as `` = Goals ; A = `` inside articles are not between blank
    lines)."""
    return [
        i
        for i in range(1, len(lines) - 1)
        if _ARTICLE_TITLE.match(lines[i]) and not lines[i - 1].strip() and not lines[i + 1].strip()
    ]


def _read_split(path: Path) -> tuple[list[str], list[str]]:
    from gencraft.data.io import read_text

    lines = read_text(path).split("\n")
    if lines and lines[-1] == "":  # the newline that ends the file opens no new line
        lines.pop()
    tokens = [tok for line in lines for tok in (*line.split(), EOS)]
    return lines, tokens


def load_lm_corpus(
    name: str, data_dir: str | os.PathLike | None = None, splits: tuple[str, ...] = LM_SPLITS
) -> LMCorpus:
    """Load ``wikitext-2``, ``wikitext-103`` or ``ptb`` from the official files.

    Args:
        name: corpus name, or a path (:mod:`gencraft.data.own`: a text file for every
            split, or a folder with ``train.txt``/``valid.txt``/``test.txt``).
        data_dir: directory holding ``<name>/`` (default ``$GENCRAFT_DATA_DIR``; downloads the
            official release when neither is set and the network is allowed).
        splits: which splits to tokenise (``train`` is always read, for the vocabulary).
    """
    from gencraft.data.own import corpus_files, is_path_spec

    name = os.fspath(name)
    own = name not in _FILES and is_path_spec(name, LM_CORPORA)
    if name not in _FILES and not own:
        raise DataError(
            f"unknown language-modelling corpus {name!r}; choose one of {', '.join(LM_CORPORA)}, "
            "or give a text file or a folder with train.txt, valid.txt and test.txt"
        )
    keep = [normalize_split(s, LM_SPLITS) for s in splits]
    wanted = list(dict.fromkeys(["train", *keep]))
    if own:  # a researcher's text file or folder
        files = corpus_files(name, tuple(wanted))
    else:
        pattern = _FILES[name]
        root = dataset_dir(name, data_dir, pattern.format(split="train"))
        files = {s: root / pattern.format(split=s) for s in wanted}
    for split in wanted:
        if not files[split].is_file():
            raise DataError(f"{name}: missing {files[split]}")
    key = (name, tuple(keep), *((s, str(files[s]), *_stamp(files[s])) for s in wanted))
    if key in _CORPORA:  # the same unchanged files: tokenised once per process
        _CORPORA.move_to_end(key)
        hit = _CORPORA[key]
        return LMCorpus(hit.name, hit.vocab, dict(hit.splits), dict(hit.lines))
    corpus = _tokenise(name, files, wanted, keep, own)
    _CORPORA[key] = corpus
    while len(_CORPORA) > _CORPORA_KEPT:
        _CORPORA.popitem(last=False)
    return LMCorpus(corpus.name, corpus.vocab, dict(corpus.splits), dict(corpus.lines))


#: tokenised corpora kept in memory, by their files' paths, sizes and modification times
_CORPORA: OrderedDict[tuple, LMCorpus] = OrderedDict()
_CORPORA_KEPT = 4


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


def _tokenise(
    name: str, files: dict[str, Path], wanted: list[str], keep: list[str], own: bool
) -> LMCorpus:
    lines: dict[str, list[str]] = {}
    tokens: dict[str, list[str]] = {}
    for split in wanted:
        lines[split], tokens[split] = _read_split(files[split])
    if own:
        empty = [str(files[s]) for s in wanted if not any(t != EOS for t in tokens[s])]
        if empty:
            raise DataError(f"{empty[0]}: no words in it (an empty split)")
    vocab = Vocabulary.build(tokens["train"])
    if own and UNK not in vocab.stoi:  # own text: words unseen in training become <unk>
        vocab = Vocabulary([*vocab.itos, UNK], [*vocab.counts, 0])
    encoded = {s: vocab.encode(tokens[s]) for s in wanted}
    return LMCorpus(
        name,
        vocab,
        {s: encoded[s] for s in wanted if s in keep},
        {s: lines[s] for s in wanted if s in keep},
    )


_DETOK_RULES: list[tuple[str, str]] = [
    (r" @(.)@ ", r"\1"),  # 8 @,@ 600 -> 8,600 ; well @-@ known -> well-known
    (r" ([.,:;!?%])", r"\1"),
    (r"([\(\[\{]) ", r"\1"),
    (r" ([\)\]\}])", r"\1"),
    (r'" ([^"]*?) "', r'"\1"'),
    (r" (n't|'s|'re|'ve|'m|'ll|'d)\b", r"\1"),
    (r"s ' ", "s' "),
    (r"^( ?=+) (.*?) (=+) ?$", r"\1 \2 \3"),
]


def wikitext_detokenize(text: str) -> str:
    """Undo WikiText/Moses tokenisation (``@-@``, ``@,@``, spaces before punctuation, around
    brackets and quotes) so that a subword LM sees natural text. Applied line by line."""
    out = []
    for line in text.split("\n"):
        for pat, rep in _DETOK_RULES:
            line = re.sub(pat, rep, line)
        out.append(line.strip() if not line.startswith(" =") else line.rstrip())
    return "\n".join(out)


def _split_text(
    name: str, split: str, data_dir: str | os.PathLike | None, max_words: int | None
) -> tuple[LMCorpus, int, str]:
    """The corpus, the word count kept (the first ``max_words``; None: all) and their
    detokenised text: what :func:`subword_stream` tokenises."""
    corpus = load_lm_corpus(name, data_dir, splits=(split,))
    words = int(corpus[split].numel()) if max_words is None else min(max_words, len(corpus[split]))
    return corpus, words, corpus.text(split, words)


def subword_stream(
    name: str,
    split: str,
    tokenizer,
    *,
    data_dir: str | os.PathLike | None = None,
    max_words: int | None = None,
    add_bos: bool = True,
) -> tuple[torch.Tensor, int]:
    """A word-level corpus split as one subword stream for a pretrained LM: the first
    ``max_words`` word tokens (``<eos>`` included, as the word-level models count them),
    detokenised, then tokenised by ``tokenizer`` (its BOS first when ``add_bos``, so every text
    token is scored). Returns ``(ids [N], words)``; per-word perplexity is
    ``exp(summed NLL of ids[1:] / words)``."""
    _, words, text = _split_text(name, split, data_dir, max_words)
    ids = tokenizer(text, add_special_tokens=False).input_ids
    bos = getattr(tokenizer, "bos_token_id", None)
    if add_bos and bos is not None:
        ids = [bos, *ids]
    return torch.tensor(ids, dtype=torch.long), words


def stream_articles(
    name: str,
    split: str,
    tokenizer,
    *,
    data_dir: str | os.PathLike | None = None,
    max_words: int | None = None,
    add_bos: bool = True,
) -> torch.Tensor:
    """The article of each token of :func:`subword_stream`'s stream (the same arguments):
    ``[N]`` indices counting WikiText's articles from 0 in order; a token before the first
    title (the BOS) belongs to article 0. A token belongs to the article whose title line
    starts at or before the character it starts at. Needs a fast tokenizer (its offsets)."""
    if not getattr(tokenizer, "is_fast", False):
        raise DataError(
            f"stream_articles needs a fast tokenizer (character offsets); "
            f"{type(tokenizer).__name__} is not one"
        )
    corpus, _, text = _split_text(name, split, data_dir, max_words)
    line_starts = [0]
    for line in text.split("\n")[:-1]:
        line_starts.append(line_starts[-1] + len(line) + 1)
    titles = [line_starts[i] for i in article_title_lines(corpus.lines[split][: len(line_starts)])]
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    found = [max(0, bisect.bisect_right(titles, a) - 1) for a, _ in enc["offset_mapping"]]
    if add_bos and getattr(tokenizer, "bos_token_id", None) is not None:
        found = [0, *found]
    return torch.tensor(found, dtype=torch.long)
