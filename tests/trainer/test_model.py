"""An engineer builds BiSeNetV2 at the paper's size and at the small sizes tests and laptops use."""

from __future__ import annotations

import pytest
import torch

from trainer.model import BiSeNetV2, inference_parameters

# Yu et al., IJCV 2021: about 3.4 M parameters at inference (3.36 M as counted by mmsegmentation).
PAPER_PARAMETERS = 3.36e6


def test_width_one_is_the_papers_network_of_about_3_4_million_parameters() -> None:
    parameters = inference_parameters(BiSeNetV2(num_classes=19, width=1.0))
    assert abs(parameters - PAPER_PARAMETERS) / PAPER_PARAMETERS < 0.02, (
        f"{parameters} inference parameters; the paper's BiSeNetV2 has about {PAPER_PARAMETERS:.0f}"
    )


def test_a_smaller_width_gives_a_much_smaller_network() -> None:
    full = inference_parameters(BiSeNetV2(num_classes=19, width=1.0))
    quarter = inference_parameters(BiSeNetV2(num_classes=19, width=0.25))
    assert quarter < full / 10, f"width 0.25 still has {quarter} of {full} parameters"


@pytest.mark.parametrize(("height", "width"), [(64, 128), (60, 100), (32, 64)])
def test_training_returns_main_and_four_booster_logits_at_input_size(height: int, width: int) -> None:
    model = BiSeNetV2(num_classes=19, width=0.25).train()
    outputs = model(torch.randn(2, 3, height, width))
    assert len(outputs) == 5, f"{len(outputs)} outputs in training; expected main + 4 boosters"
    for output in outputs:
        assert output.shape == (2, 19, height, width), f"logits {tuple(output.shape)}"


def test_evaluation_returns_only_the_main_logits() -> None:
    model = BiSeNetV2(num_classes=7, width=0.25).eval()
    with torch.no_grad():
        outputs = model(torch.randn(1, 3, 64, 128))
    assert [tuple(o.shape) for o in outputs] == [(1, 7, 64, 128)]


def test_without_booster_heads_none_are_built() -> None:
    model = BiSeNetV2(num_classes=19, width=0.25, aux=False).train()
    assert model.aux_heads is None
    assert len(model(torch.randn(2, 3, 32, 64))) == 1


def test_a_width_of_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="width"):
        BiSeNetV2(num_classes=19, width=0.0)
