import pytest
import torch

from gencraft.data import EOS, UNK, Vocabulary, load_lm_corpus, wikitext_detokenize
from gencraft.errors import DataError

WIKI_TRAIN = (
    " \n"
    " = Valkyria Chronicles = \n"
    " \n"
    " The game 's well @-@ known sequel sold 8 @,@ 600 copies , or 1 @.@ 5 % . \n"
    " \n"
    " = = Gameplay = = \n"
    " \n"
    " The <unk> game is a game . \n"
    " = Goals ; A = \n"
)
WIKI_VALID = " \n = Other = \n \n The game sold <unk> copies . \n"


@pytest.fixture
def wiki_dir(tmp_path):
    d = tmp_path / "wikitext-2"
    d.mkdir()
    (d / "wiki.train.tokens").write_text(WIKI_TRAIN, encoding="utf-8")
    (d / "wiki.valid.tokens").write_text(WIKI_VALID, encoding="utf-8")
    (d / "wiki.test.tokens").write_text(WIKI_VALID, encoding="utf-8")
    return tmp_path


def test_wikitext_fixture_counts_eos_per_line_and_keeps_unk(wiki_dir):
    corpus = load_lm_corpus("wikitext-2", wiki_dir)
    lines = WIKI_TRAIN.split("\n")[:-1]
    expected = [t for line in lines for t in (*line.split(), EOS)]
    assert corpus.vocab.decode(corpus["train"]) == expected
    stats = corpus.stats()
    assert stats["train"]["tokens"] == len(expected) == 49
    assert stats["train"]["articles"] == 1  # " = Goals ; A = " inside the article is no title
    assert stats["valid"]["articles"] == 1
    assert UNK in corpus.vocab.stoi and "@-@" in corpus.vocab.stoi and "@,@" in corpus.vocab.stoi
    assert stats["train"]["oov_rate"] == pytest.approx(100 * 1 / 49, abs=0.01)
    assert corpus["validation"].equal(corpus["valid"])


def test_vocabulary_orders_by_frequency_then_first_occurrence():
    vocab = Vocabulary.build(["b", "a", "c", "a", "c", EOS, EOS, EOS])
    assert vocab.itos == [EOS, "a", "c", "b"]
    assert vocab.counts == [3, 2, 2, 1]
    assert vocab.encode(["c", "b"]).tolist() == [2, 3]
    with pytest.raises(DataError, match="not in the vocabulary"):
        vocab.encode(["zzz"])


def test_unseen_words_map_to_unk(wiki_dir):
    (wiki_dir / "wikitext-2" / "wiki.test.tokens").write_text(" never-seen-word \n")
    corpus = load_lm_corpus("wikitext-2", wiki_dir)
    unk = corpus.vocab.stoi[UNK]
    assert corpus["test"].tolist() == [unk, corpus.vocab.stoi[EOS]]


def test_corpus_text_and_detokenizer(wiki_dir):
    corpus = load_lm_corpus("wikitext-2", wiki_dir, splits=("train",))
    text = corpus.text("train")
    assert "The game's well-known sequel sold 8,600 copies, or 1.5%." in text
    assert "\n= = Gameplay = =\n" in text
    raw = corpus.text("train", detokenize=False)
    assert (
        raw.splitlines()[3]
        == "The game 's well @-@ known sequel sold 8 @,@ 600 copies , or 1 @.@ 5 % ."
    )
    assert wikitext_detokenize('He said " yes " ( loudly ) .') == 'He said "yes" (loudly).'


def test_bad_names_and_dirs(tmp_path, wiki_dir):
    with pytest.raises(DataError, match="unknown language-modelling corpus 'wikitext-3'"):
        load_lm_corpus("wikitext-3", wiki_dir)
    with pytest.raises(DataError, match="does not exist"):
        load_lm_corpus("ptb", tmp_path / "missing")
    with pytest.raises(DataError, match=r"no files matching ptb/ptb\.train\.txt"):
        load_lm_corpus("ptb", wiki_dir)
    with pytest.raises(DataError, match="unknown split 'dev2'"):
        load_lm_corpus("wikitext-2", wiki_dir, splits=("dev2",))


def test_no_data_dir_offline_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("GENCRAFT_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match=r"no data directory given .* downloads are disabled"):
        load_lm_corpus("ptb")


def test_data_dir_from_environment(monkeypatch, wiki_dir):
    monkeypatch.setenv("GENCRAFT_DATA_DIR", str(wiki_dir))
    assert load_lm_corpus("wikitext-2")["train"].numel() == 49


def test_table1_wikitext2(shared_data):
    corpus = load_lm_corpus("wikitext-2", shared_data)
    stats = corpus.stats()
    assert [stats[s]["tokens"] for s in ("train", "valid", "test")] == [2_088_628, 217_646, 245_569]
    assert len(corpus.vocab) == 33_278
    assert [stats[s]["articles"] for s in ("train", "valid", "test")] == [600, 60, 60]
    assert stats["train"]["oov_rate"] == pytest.approx(2.6, abs=0.05)
    assert corpus["train"].dtype == torch.long


def test_table1_ptb(shared_data):
    corpus = load_lm_corpus("ptb", shared_data)
    stats = corpus.stats()
    assert stats["train"]["tokens"] == 929_589
    assert (stats["valid"]["tokens"], stats["test"]["tokens"]) == (73_760, 82_430)
    assert len(corpus.vocab) == 10_000
    assert stats["train"]["oov_rate"] == pytest.approx(4.8, abs=0.05)


def test_equal_counts_keep_first_occurrence_not_alphabetical_order():
    """Ties in frequency keep the order words first occur in (as documented), which here
    differs from alphabetical order: 'zeta' is seen before 'alpha'."""
    vocab = Vocabulary.build(["zeta", "alpha", "mid", "alpha", "zeta", "mid"])
    assert vocab.itos == ["zeta", "alpha", "mid"]


def test_a_corpus_file_without_a_final_newline_keeps_its_last_line(wiki_dir):
    (wiki_dir / "wikitext-2" / "wiki.test.tokens").write_text(" The game \n The end")
    corpus = load_lm_corpus("wikitext-2", wiki_dir)
    words = corpus.vocab.decode(corpus["test"])
    assert words == ["The", "game", EOS, "The", UNK, EOS]  # "end" is not in train
    (wiki_dir / "wikitext-2" / "wiki.test.tokens").write_text(" The game \n The end \n")
    assert corpus.vocab.decode(load_lm_corpus("wikitext-2", wiki_dir)["test"]) == words
