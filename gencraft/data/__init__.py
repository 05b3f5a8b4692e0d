"""Datasets from their official file formats.

Data directory: the ``data_dir`` argument / CLI ``--data-dir``, else ``$GENCRAFT_DATA_DIR``,
else the canonical public source (downloaded once into the gencraft cache; refused offline).
"""

from gencraft.data.data2text import (
    DATA_TO_TEXT_DATASETS,
    DataToTextExample,
    linearize_e2e,
    linearize_triples,
    load_data_to_text,
    parse_e2e_mr,
)
from gencraft.data.io import read_jsonl, read_lines
from gencraft.data.lm import (
    EOS,
    LM_CORPORA,
    UNK,
    LMCorpus,
    Vocabulary,
    load_lm_corpus,
    stream_articles,
    subword_stream,
    wikitext_detokenize,
)
from gencraft.data.sources import DATA_DIR_ENV, SOURCES, configured_data_dir
from gencraft.data.summarization import (
    LOCAL_SPLIT,
    SUMMARIZATION_DATASETS,
    SummarizationExample,
    load_summarization,
    local_split,
)
from gencraft.data.tasks import (
    pick_examples,
    references_of,
    source_of,
    task_examples,
    training_pairs,
)

DATASETS = (*LM_CORPORA, *SUMMARIZATION_DATASETS, *DATA_TO_TEXT_DATASETS)

__all__ = [
    "DATASETS",
    "DATA_DIR_ENV",
    "DATA_TO_TEXT_DATASETS",
    "EOS",
    "LM_CORPORA",
    "LOCAL_SPLIT",
    "SOURCES",
    "SUMMARIZATION_DATASETS",
    "UNK",
    "DataToTextExample",
    "LMCorpus",
    "SummarizationExample",
    "Vocabulary",
    "configured_data_dir",
    "linearize_e2e",
    "linearize_triples",
    "load_data_to_text",
    "load_lm_corpus",
    "load_summarization",
    "local_split",
    "parse_e2e_mr",
    "pick_examples",
    "read_jsonl",
    "read_lines",
    "references_of",
    "source_of",
    "stream_articles",
    "subword_stream",
    "task_examples",
    "training_pairs",
    "wikitext_detokenize",
]
