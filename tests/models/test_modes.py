"""``scoring``: eval mode and no gradients inside, the caller's mode back afterwards, also
after an error."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gencraft.models.modes import scoring


@pytest.mark.parametrize("training", [True, False])
def test_inside_eval_without_gradients_and_the_mode_back_after(training):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5)).train(training)
    x = torch.randn(4, 3)
    with scoring(m) as inside:
        assert inside is m and not m.training and not m[1].training
        assert not torch.is_grad_enabled()
        y = m(x)
    assert torch.is_grad_enabled() and not y.requires_grad
    assert torch.equal(y, m[0](x))  # no dropout while scoring
    assert m.training is training and m[1].training is training


def test_the_mode_comes_back_after_an_error():
    m = nn.Linear(2, 2).train()
    with pytest.raises(RuntimeError, match="boom"), scoring(m):
        raise RuntimeError("boom")
    assert m.training and torch.is_grad_enabled()
