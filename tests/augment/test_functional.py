"""Per-sample batched kernels against torchvision's per-image functionals, one image at a time."""

from __future__ import annotations

import math

import pytest
import torch
from torchvision.transforms.v2 import functional as TF

from contrastive.augment import functional as AF


@pytest.fixture
def batch() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(6, 3, 20, 24, generator=g)
    # awkward pixels: gray (chroma 0), ties between the max channels, pure black and white
    x[0, :, 0, :5] = 0.5
    x[1, 0, 1, :5] = 0.9
    x[1, 1, 1, :5] = 0.9
    x[2, :, 2, :3] = 0.0
    x[2, :, 3, :3] = 1.0
    return x


def per_image(fn, x: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """The reference: torchvision applied to each image with its own parameter (a loop)."""
    return torch.stack([fn(x[i], float(params[i])) for i in range(x.shape[0])])


@pytest.mark.parametrize(
    "ours, theirs, lo, hi",
    [
        (AF.adjust_brightness_, TF.adjust_brightness, 0.0, 2.0),
        (AF.adjust_contrast_, TF.adjust_contrast, 0.0, 2.0),
        (AF.adjust_saturation_, TF.adjust_saturation, 0.0, 2.0),
        (AF.adjust_hue_, TF.adjust_hue, -0.5, 0.5),
    ],
    ids=["brightness", "contrast", "saturation", "hue"],
)
def test_colour_kernels_match_torchvision_per_sample(batch, ours, theirs, lo, hi):
    params = torch.linspace(lo, hi, batch.shape[0])
    expected = per_image(theirs, batch, params)
    got = ours(batch.clone(), params)
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=0)
    assert got.min() >= 0 and got.max() <= 1


def test_hue_shift_of_full_turn_is_identity(batch):
    got = AF.adjust_hue_(batch.clone(), torch.full((batch.shape[0],), 0.5))
    back = AF.adjust_hue_(got, torch.full((batch.shape[0],), -0.5))
    torch.testing.assert_close(back, batch, atol=2e-6, rtol=0)


def test_grayscale_and_solarize_match_formulas(batch):
    gray = AF.grayscale_(batch.clone())
    r, g, b = batch.unbind(1)
    luma = 0.2989 * r + 0.587 * g + 0.114 * b
    for c in range(3):
        torch.testing.assert_close(gray[:, c], luma)
    sol = AF.solarize_(batch.clone(), 0.5)
    expected = torch.where(batch >= 0.5, 1 - batch, batch)
    torch.testing.assert_close(sol, expected)


def test_blur_radius_rule():
    assert AF.blur_radius(0.1, 23) == 1
    assert AF.blur_radius(1.0, 23) == 4
    assert AF.blur_radius(2.0, 23) == 8
    assert AF.blur_radius(5.0, 23) == 11  # capped by the kernel size
    assert AF.blur_radius(2.0, 3) == 1


@pytest.mark.parametrize("method", ["shifted", "conv"])
def test_blur_matches_torchvision_with_the_same_taps(batch, method):
    sigma = torch.tensor([0.1, 0.4, 0.9, 1.3, 1.7, 2.0])
    expected = []
    for i in range(batch.shape[0]):
        k = 2 * AF.blur_radius(float(sigma[i]), 23) + 1
        k = min(k, 2 * ((min(batch.shape[-2:]) - 1) // 2) + 1)
        expected.append(TF.gaussian_blur(batch[i], [k, k], [float(sigma[i])] * 2))
    expected = torch.stack(expected)
    got = AF.gaussian_blur(batch.clone(), sigma, 23, method=method)
    # taps truncated at 4 sigma, the same rule for every sample -> equal to float rounding
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_blur_truncation_changes_pixels_by_less_than_1e4(batch):
    sigma = torch.full((batch.shape[0],), 2.0)
    x = torch.rand(6, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    full = torch.stack([TF.gaussian_blur(x[i], [23, 23], [2.0, 2.0]) for i in range(6)])
    got = AF.gaussian_blur(x, sigma, 23)
    assert (got - full).abs().max() < 1e-4


def test_gaussian_kernels_are_normalised_gaussians():
    sigma = torch.tensor([0.5, 1.0, 2.0])
    k = AF.gaussian_kernels(sigma, 23)
    assert k.shape == (3, 17)  # radius of the largest sigma: ceil(4 * 2) = 8
    torch.testing.assert_close(k.sum(1), torch.ones(3))
    t = torch.arange(-8, 9, dtype=torch.float32)
    for i, s in enumerate(sigma.tolist()):
        r = math.ceil(4 * s)
        w = torch.exp(-t**2 / (2 * s * s)) * (t.abs() <= r)
        torch.testing.assert_close(k[i], w / w.sum())


def test_normalize_formula():
    x = torch.rand(2, 3, 4, 4)
    mean, std = torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0.5, 0.25, 2.0])
    expected = (x - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1)
    torch.testing.assert_close(AF.normalize(x, mean, std), expected)
    torch.testing.assert_close(AF.normalize_(x.clone(), mean, std), expected)


@pytest.mark.parametrize("scale, ratio", [((0.08, 1.0), (3 / 4, 4 / 3)), ((1.0, 1.0), (1.0, 1.0)),
                                          ((0.05, 0.4), (0.1, 0.2)), ((0.9, 1.0), (5.0, 9.0))])
def test_random_resized_crop_box_draws_as_torchvision(scale, ratio):
    """Our box sampler (no torchvision import) gives torchvision's ``get_params`` boxes and
    leaves the global generator where it leaves it, including the centred fallback (the last
    two ratio ranges force it for most sizes)."""
    from torchvision.transforms import RandomResizedCrop

    from contrastive.augment.per_image import random_resized_crop_box

    sizes = torch.randint(1, 300, (200, 2), generator=torch.Generator().manual_seed(0)).tolist()
    for seed, (h, w) in enumerate(sizes):
        torch.manual_seed(seed)
        ours, after = random_resized_crop_box(h, w, scale, ratio), torch.rand(1)
        torch.manual_seed(seed)
        theirs = RandomResizedCrop.get_params(torch.empty(3, h, w), list(scale), list(ratio))
        assert ours == theirs and torch.equal(after, torch.rand(1)), (h, w)


def test_centre_crop_and_normalisation_match_torchvision_bit_for_bit():
    """The evaluation view without torchvision: resize (bilinear, antialiased) + centre crop +
    normalise give torchvision's pixels exactly, for both memory layouts of the input."""
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.v2 import functional as TF

    from contrastive.augment.config import ViewConfig
    from contrastive.augment.per_image import CenterCropUint8, PerImageView

    g = torch.Generator().manual_seed(0)
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    for case in range(60):
        h, w = torch.randint(8, 120, (2,), generator=g).tolist()
        size = int(torch.randint(4, min(h, w) + 1, (1,), generator=g))
        resize = int(size * (1.0, 1.14, 1.5)[case % 3])
        img = torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g)
        if case % 2:  # channels-last memory, as a PIL image converts
            img = img.permute(1, 2, 0).contiguous().permute(2, 0, 1)
        s = resize / min(h, w)
        new = [max(size, round(h * s)), max(size, round(w * s))]
        ref = TF.center_crop(TF.resize(img, new, InterpolationMode.BILINEAR, antialias=True),
                             [size, size])
        assert torch.equal(CenterCropUint8(size, resize)(img), ref), (h, w, size, resize)
        view = PerImageView(ViewConfig(size=size, crop="center", crop_pct=size / resize,
                                       flip_p=0.0), mean, std)
        expected = TF.normalize(TF.center_crop(TF.resize(
            img, [max(size, round(h * view.crop.resize / min(h, w))),
                  max(size, round(w * view.crop.resize / min(h, w)))],
            InterpolationMode.BILINEAR, antialias=True), [size, size]).float().mul_(1.0 / 255.0),
            mean, std)  # the view scales to [0, 1] by multiplying with 1 / 255
        assert torch.equal(view(img), expected), (h, w, size)
