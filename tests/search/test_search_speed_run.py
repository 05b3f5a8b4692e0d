"""`search-speed` on a tiny model: every round's outputs compared with `generate`'s over
batches whose last one is short, and the comparison itself refusing outputs that differ."""

from __future__ import annotations

import json

from gencraft.models import load_model
from gencraft.studies.runner import reproduce
from gencraft.studies.search_inputs import batched, instruction_prompts
from gencraft.studies.search_speed import SpeedSettings, _generate_beams, _our_beams, _same


def test_rounds_compare_every_prompt_with_generate(shared_data, tmp_path):
    overrides = {"data_dir": str(shared_data), "prompts": 3, "batch_size": 2, "rounds": 2}
    report = reproduce("search-speed", scale="tiny", output=tmp_path, overrides=overrides)
    units = json.loads((tmp_path / "results.json").read_text())["units"]
    assert sorted(units) == ["round 0", "round 1"]
    assert all(u["identical"] is True and u["gencraft"] > 0 < u["generate"] for u in units.values())
    assert "3 prompts in left-padded batches of 2" in report.read_text()


def test_the_comparison_refuses_outputs_that_differ(shared_data):
    s = SpeedSettings(model="tiny-llama", prompts=3, batch_size=2, new_tokens=6)
    model, tok = load_model(s.model)
    batches = batched(
        model, tok, instruction_prompts(tok, s.prompts, str(shared_data)), s.batch_size
    )
    assert [ids.shape[0] for ids, _ in batches] == [2, 1]
    eos = model.generation_config.eos_token_id
    eos = eos if isinstance(eos, int) else eos[0]
    ours, theirs = _our_beams(model, batches, s), _generate_beams(model, batches, s, eos)
    assert len(ours) == len(theirs) == 3 and _same(ours, theirs, eos)
    # one prompt's best hypothesis with its first token changed
    h = ours[1][0]
    changed = type(h)(**{**vars(h), "tokens": [h.tokens[0] + 1, *h.tokens[1:]]})
    assert not _same([ours[0], [changed], ours[2]], theirs, eos)
    # a finished hypothesis must end where generate wrote EOS
    flipped = type(h)(**{**vars(h), "finished": not h.finished})
    assert not _same([ours[0], [flipped], ours[2]], theirs, eos)
