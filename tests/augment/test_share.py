"""A process's share of a global micro-batch's random numbers (:mod:`contrastive.augment.share`):
the batched colour augmentation and the resident crops give process ``r`` of ``W`` exactly the
views that one process gives rows ``r::W`` of the global batch, and one process draws what it
drew before the rule (its share is every row)."""

from __future__ import annotations

import pytest
import torch

from contrastive.augment import get_pipeline
from contrastive.augment.device_crop import ResidentViews, random_resized_boxes
from contrastive.augment.share import WHOLE, Share, rand_rows
from contrastive.data.loader import mix_seed
from contrastive.engine.loader import step_generator


def _gen(seed: int = 5) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_one_process_draws_the_stream_it_drew_before() -> None:
    assert torch.equal(rand_rows(6, (3,), _gen(), WHOLE), torch.rand((6, 3), generator=_gen()))
    # the step's generator is rank 0's of the per-process rule (the recipe digests' stream)
    assert step_generator(torch.device("cpu"), 7, 3, 1).initial_seed() == mix_seed(
        7, 0xA46, 3, 1, 0)


def test_a_share_is_its_rows_of_the_global_draw() -> None:
    whole = rand_rows(6, (2, 3), _gen(), dtype=torch.float64)  # (6, 2, 3)
    for rank in range(3):
        part = rand_rows(2, (2, 3), _gen(), Share(rank, 3), dtype=torch.float64)
        assert torch.equal(part, whole[rank::3])
    with pytest.raises(ValueError, match="rank 2 is not one of 2 processes"):
        rand_rows(2, (1,), _gen(), Share(2, 2))


@pytest.mark.parametrize("strategy", ["grouped", "dense"])
def test_device_augment_gives_each_process_the_one_process_views(strategy: str) -> None:
    worker_fn, device_fn = get_pipeline("simclr", image_size=16).split()
    device_fn.strategy = strategy
    views = [torch.randint(0, 256, (8, 3, 16, 16), dtype=torch.uint8, generator=_gen(1))
             for _ in device_fn.views]
    whole = device_fn(views, generator=_gen())
    for rank in range(2):
        part = device_fn([v[rank::2] for v in views], generator=_gen(), share=Share(rank, 2))
        for a, b in zip(part, whole):
            torch.testing.assert_close(a, b[rank::2], rtol=0, atol=1e-6)
    # the rows matter: another process's share is other views
    other = device_fn([v[1::2] for v in views], generator=_gen(), share=Share(0, 2))
    assert not torch.allclose(other[0], whole[0][1::2])


def test_resident_crops_give_each_process_the_one_process_crops() -> None:
    images = torch.randint(0, 256, (12, 3, 20, 20), dtype=torch.uint8, generator=_gen(2))
    views = get_pipeline("simclr", image_size=16).views
    crops = ResidentViews(images, views)
    indices = torch.tensor([3, 7, 0, 11, 5, 2])
    whole = crops(indices, _gen())
    for rank in range(2):
        part = crops(indices[rank::2], _gen(), Share(rank, 2))
        for a, b in zip(part, whole):
            assert torch.equal(a, b[rank::2])
    boxes = random_resized_boxes(6, 20, 20, (0.08, 1.0), (3 / 4, 4 / 3), _gen())
    assert torch.equal(random_resized_boxes(3, 20, 20, (0.08, 1.0), (3 / 4, 4 / 3), _gen(),
                                            Share(1, 2)), boxes[1::2])
