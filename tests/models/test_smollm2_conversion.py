"""SmolLM2's GGUF conversion under the installed transformers release (CI's set here; `make
test-compat` runs this file under the newest and the floor releases too): BOS, EOS and pad
come from the GGUF metadata, the tokenizer gives the same ids under every release, and each
release has its own conversion cache."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


#: token ids of these texts under transformers 5.23.0 (CI's release); every release must give
#: the same, the floor (5.5.0) included, whose own conversion adds a BOS to every input and
#: five CodeLlama infill tokens past the embedding (byte_level_tokenizer undoes both)
GOLDEN = {
    "<|im_start|>user\nhi<|im_end|>": [1, 4093, 198, 6004, 2],
    "def f(x):\n    return x<FILL_ME>": [
        1604,
        275,
        24,
        104,
        727,
        472,
        1003,
        1792,
        44,
        15410,
        60,
        79,
        3945,
        46,
    ],
    "Héllo wörld ▁ 東京 🙂  two  spaces\ttab": [
        56,
        2756,
        31394,
        267,
        29989,
        400,
        29566,
        219,
        17097,
        247,
        126,
        16736,
        122,
        47526,
        216,
        827,
        216,
        5600,
        197,
        15999,
    ],
}


def test_smollm2_tokenizes_the_same_under_every_release():
    from gencraft.models import load_model

    model, tok = load_model("smollm2-135m")
    assert len(tok) == model.get_input_embeddings().weight.shape[0] == 49152
    for text, ids in GOLDEN.items():
        assert tok(text)["input_ids"] == ids, text
        assert tok.decode(ids) == text
    assert (tok.bos_token_id, tok.unk_token_id) == (1, 0)


def test_smollm2_special_tokens_follow_the_gguf_metadata():
    import transformers

    from gencraft.models import load_model
    from gencraft.models.pretrained import gguf_special_ids, smollm2_dir, smollm2_gguf_path

    meta = gguf_special_ids(smollm2_gguf_path())
    assert meta == {"bos": 1, "eos": 2, "pad": 2}  # <|im_start|>, <|im_end|>, <|im_end|>
    model, tok = load_model("smollm2-135m")
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2
    assert tok.pad_token_id == 2
    assert model.config.eos_token_id == 2 and model.config.pad_token_id == 2
    assert model.generation_config.eos_token_id in (2, [2])
    assert smollm2_dir().name.endswith(transformers.__version__)  # one cache per release
    print(
        f"transformers {transformers.__version__}: eos {tok.eos_token_id}, pad {tok.pad_token_id}"
    )


def test_fame_targets_end_with_the_id_generation_stops_on():
    from gencraft.focus.data import SummaryEncoder
    from gencraft.models import load_model
    from gencraft.models.introspect import target_eos_id

    model, tok = load_model("smollm2-135m")
    tok.eos_token = "<|im_start|>"  # what transformers 5.14's conversion gave (id 1)
    with pytest.warns(UserWarning, match="tokenizer's EOS is id 1"):
        eos = target_eos_id(model, tok)
    assert eos == 2
    enc = SummaryEncoder(tok, False, 16, 8, eos_token_id=eos)
    assert enc.encode("A document.", "A summary.")["labels"][-1] == 2


def _as_old_releases_convert_it(tok):
    """SmolLM2's tokenizer as transformers < 5.14 converts it (measured under 5.5.0): five
    infill tokens past the vocabulary, a BOS added to every input, byte fallback, a decoder
    that turns '▁' into spaces."""
    import json

    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    data = json.loads(tok.backend_tokenizer.to_str())
    for i, t in enumerate(["▁<PRE>", "▁<MID>", "▁<SUF>", "▁<EOT>", "<FILL_ME>"]):
        data["added_tokens"].append(
            {
                "id": 49152 + i,
                "content": t,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )
    bos = {"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}
    data["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [
            bos,
            {"Sequence": {"id": "A", "type_id": 0}},
            {"Sequence": {"id": "B", "type_id": 1}},
        ],
        "special_tokens": {
            "<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}
        },
    }
    data["decoder"] = {
        "type": "Sequence",
        "decoders": [
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        ],
    }
    data["model"].update(byte_fallback=True, fuse_unk=True, unk_token="<|endoftext|>")
    old = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(data)), bos_token="<|im_start|>"
    )
    old.add_bos_token = True
    return old


def test_an_old_release_conversion_is_rebuilt_byte_level():
    """What byte_level_tokenizer does under the floor release, checked under any release."""
    from gencraft.models import load_model
    from gencraft.models.pretrained import byte_level_tokenizer, smollm2_gguf_path

    _, tok = load_model("smollm2-135m")
    old = _as_old_releases_convert_it(tok)
    assert len(old) == 49157 and old("hi")["input_ids"][0] == 1  # damaged as 5.5.0 gives it
    fixed = byte_level_tokenizer(old, smollm2_gguf_path())
    assert len(fixed) == 49152 and fixed.unk_token_id == 0
    for text, ids in GOLDEN.items():
        assert fixed(text)["input_ids"] == ids, text
        assert fixed.decode(ids) == text
    assert byte_level_tokenizer(tok, smollm2_gguf_path()) is tok  # already byte-level: kept
