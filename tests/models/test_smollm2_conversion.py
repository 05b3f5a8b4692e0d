"""SmolLM2's GGUF conversion under the installed transformers release (CI's set here; `make
test-compat` runs this file under the newest and the floor releases too): BOS, EOS and pad
come from the GGUF metadata, and each release has its own conversion cache."""

from __future__ import annotations

import pytest

from gencraft.errors import ModelLoadError

pytestmark = pytest.mark.slow


def _old_release() -> bool:
    import transformers
    from packaging.version import Version

    return Version(transformers.__version__) < Version("5.14")


# measured in make test-compat (2026-11-25): under the floor, transformers 5.5.0, the GGUF
# conversion gives a tokenizer of 49,157 tokens for an embedding table of 49,152 rows, and
# load_model refuses it; strict, so a fix shows up as a failure to remove this mark
FLOOR_FAILS = pytest.mark.xfail(
    condition=_old_release(),
    raises=ModelLoadError,
    strict=True,
    reason="SmolLM2's GGUF tokenizer converts to 49,157 tokens under transformers < 5.14",
)


@FLOOR_FAILS
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


@FLOOR_FAILS
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
