"""The per-image path and the batched path draw views from the same distribution.

Each test turns on one operation (or a whole preset), draws N views of one image through each
path, and compares per-view statistics: exact fractions for the Bernoulli operations, a
two-sample Kolmogorov-Smirnov test (alpha = 0.001, written out below) for continuous ones, and
where the law is known in closed form, the law itself (e.g. brightness factor ~ U[0.6, 1.4]).
Seeds are fixed, so the tests are deterministic.
"""

from __future__ import annotations

import math

import pytest
import torch

from contrastive.augment import DeviceAugment, ViewConfig, get_pipeline
from contrastive.augment.per_image import PerImageView, build_crop

N = 1000
ZERO, ONE = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)  # no normalisation: views stay in [0, 1]
IDENTITY_CROP = dict(size=32, scale=(1.0, 1.0), ratio=(1.0, 1.0))


def colourful(seed: int = 0) -> torch.Tensor:
    """A 32 x 32 uint8 image: smooth colour gradients plus texture, values away from 0 and 255."""
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.linspace(0, 1, 32), torch.linspace(0, 1, 32), indexing="ij")
    base = torch.stack([0.25 + 0.4 * xx, 0.25 + 0.4 * yy, 0.6 - 0.3 * xx * yy])
    noise = 0.08 * torch.rand(3, 32, 32, generator=g)
    return ((base + noise) * 255).round().to(torch.uint8)


def per_image(cfg: ViewConfig, img: torch.Tensor, n: int = N, seed: int = 0) -> torch.Tensor:
    view = PerImageView(cfg, ZERO, ONE)
    torch.manual_seed(seed)
    return torch.stack([view(img) for _ in range(n)])


def batched(cfg: ViewConfig, img: torch.Tensor, n: int = N, seed: int = 0) -> torch.Tensor:
    crop = build_crop(cfg)(img)
    dev = DeviceAugment([cfg], ZERO, ONE)
    return dev([crop.unsqueeze(0).repeat(n, 1, 1, 1)], torch.Generator().manual_seed(seed))[0]


def ks_statistic(a: torch.Tensor, b: torch.Tensor) -> float:
    """sup |F_a - F_b| over the pooled sample (two-sample Kolmogorov-Smirnov)."""
    a, b = a.double().sort().values, b.double().sort().values
    pooled = torch.cat([a, b])
    fa = torch.searchsorted(a, pooled, right=True).double() / a.numel()
    fb = torch.searchsorted(b, pooled, right=True).double() / b.numel()
    return float((fa - fb).abs().max())


def ks_critical(n: int, m: int, alpha: float = 1e-3) -> float:
    return math.sqrt(-0.5 * math.log(alpha / 2)) * math.sqrt((n + m) / (n * m))


def assert_same_law(a: torch.Tensor, b: torch.Tensor) -> None:
    d, crit = ks_statistic(a, b), ks_critical(a.numel(), b.numel())
    assert d < crit, f"KS statistic {d:.4f} >= critical {crit:.4f}"


def assert_rate(x: torch.Tensor, p: float) -> None:
    """A Bernoulli(p) sample mean within 4.5 standard errors of p."""
    se = math.sqrt(p * (1 - p) / x.numel())
    assert abs(float(x.double().mean()) - p) < 4.5 * se + 1e-12, (float(x.double().mean()), p)


def is_gray(v: torch.Tensor) -> torch.Tensor:
    return ((v[:, 0] - v[:, 1]).abs().amax((1, 2)) < 1e-6) & ((v[:, 1] - v[:, 2]).abs().amax((1, 2)) < 1e-6)


@pytest.mark.parametrize("path", [per_image, batched], ids=["per_image", "batched"])
def test_grayscale_fraction(path):
    v = path(ViewConfig(**IDENTITY_CROP, grayscale_p=0.2), colourful())
    assert_rate(is_gray(v), 0.2)


@pytest.mark.parametrize("path", [per_image, batched], ids=["per_image", "batched"])
def test_flip_rate(path):
    img = colourful()
    img[:, :, :16] = 230  # a bright left half
    v = path(ViewConfig(**IDENTITY_CROP, flip_p=0.5), img)
    flipped = v[..., :16].mean((1, 2, 3)) < v[..., 16:].mean((1, 2, 3))
    assert_rate(flipped, 0.5)
    exact = img.float() / 255
    assert all(torch.allclose(x, exact, atol=1e-6) or torch.allclose(x, exact.flip(-1), atol=1e-6) for x in v[:50])


@pytest.mark.parametrize("path", [per_image, batched], ids=["per_image", "batched"])
def test_solarize_rate(path):
    img = colourful()
    v = path(ViewConfig(**IDENTITY_CROP, solarize_p=0.2), img)
    changed = (v - img.float() / 255).abs().amax((1, 2, 3)) > 1e-6
    assert_rate(changed, 0.2)


@pytest.mark.parametrize("path", [per_image, batched], ids=["per_image", "batched"])
def test_brightness_factor_follows_its_uniform_law(path):
    """Pixel values stay below 1 / 1.4, so nothing clamps and mean(out) / mean(in) is the
    factor: 1 with probability 0.2 (jitter not applied), else U[0.6, 1.4]."""
    img = (colourful().float() * 0.9).to(torch.uint8)
    assert img.max() < 255 / 1.4
    v = path(ViewConfig(**IDENTITY_CROP, jitter_p=0.8, brightness=0.4), img)
    ratio = v.mean((1, 2, 3)) / (img.float() / 255).mean()
    untouched = (ratio - 1).abs() < 1e-5
    assert_rate(untouched, 0.2)
    r = ratio[~untouched].double().sort().values
    cdf = ((r - 0.6) / 0.8).clamp(0, 1)
    empirical = torch.arange(1, r.numel() + 1, dtype=torch.float64) / r.numel()
    d = float(torch.maximum((empirical - cdf).abs(), (empirical - 1 / r.numel() - cdf).abs()).max())
    assert d < 1.95 / math.sqrt(r.numel())  # one-sample KS, alpha = 0.001


def _stats(v: torch.Tensor) -> dict[str, torch.Tensor]:
    maxc, minc = v.amax(1), v.amin(1)
    lap = (4 * v[..., 1:-1, 1:-1] - v[..., :-2, 1:-1] - v[..., 2:, 1:-1] - v[..., 1:-1, :-2] - v[..., 1:-1, 2:])
    return {
        "brightness": v.mean((1, 2, 3)),
        "contrast": v.std((1, 2, 3)),
        "saturation": (maxc - minc).mean((1, 2)),
        "red_minus_green": (v[:, 0] - v[:, 1]).mean((1, 2)),
        "sharpness": lap.abs().mean((1, 2, 3)),
    }


@pytest.mark.parametrize(
    "cfg",
    [
        ViewConfig(**IDENTITY_CROP, jitter_p=0.8, brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1),
        ViewConfig(**IDENTITY_CROP, jitter_p=0.8, brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1,
                   jitter_order="fixed"),
        ViewConfig(**IDENTITY_CROP, jitter_p=1.0, hue=0.5),
        ViewConfig(**IDENTITY_CROP, blur_p=0.5, blur_sigma=(0.1, 2.0), blur_kernel_size=9),
        ViewConfig(**IDENTITY_CROP, jitter_p=1.0, brightness=0.4, contrast=0.4, saturation=0.4, hue=0.4,
                   grayscale_p=0.2, grayscale_first=True),
    ],
    ids=["jitter-random-order", "jitter-fixed-order", "hue", "blur", "mocov1-order"],
)
def test_continuous_statistics_agree(cfg):
    img = colourful(1)
    a, b = _stats(per_image(cfg, img)), _stats(batched(cfg, img, seed=1))
    for key in a:
        assert_same_law(a[key], b[key])


def test_a_different_law_is_detected():
    """The KS check is not vacuous: brightness 0.25 instead of 0.4 is told apart."""
    img = colourful(1)
    a = _stats(batched(ViewConfig(**IDENTITY_CROP, jitter_p=0.8, brightness=0.4), img))
    b = _stats(per_image(ViewConfig(**IDENTITY_CROP, jitter_p=0.8, brightness=0.25), img, seed=2))
    assert ks_statistic(a["brightness"], b["brightness"]) > ks_critical(N, N)


def test_whole_mocov2_preset_agrees():
    """Crops included: the two paths share the crop sampler, the rest is drawn independently."""
    pipe = get_pipeline("mocov2", 32, mean=ZERO, std=ONE)
    worker_fn, device_fn = pipe.split()
    img = colourful(2)
    first_view = pipe._per_image[0]
    torch.manual_seed(3)
    a = torch.stack([first_view(img) for _ in range(N)])
    torch.manual_seed(4)
    crops = torch.stack([worker_fn(img)[0] for _ in range(N)])
    b = device_fn([crops, crops], torch.Generator().manual_seed(5))[0]
    sa, sb = _stats(a), _stats(b)
    for key in sa:
        assert_same_law(sa[key], sb[key])
    assert abs(float(is_gray(a).double().mean()) - float(is_gray(b).double().mean())) < 0.04


def test_whole_multicrop_preset_agrees_for_global_and_local_views():
    """Multi-crop (2 x 32 px global + 2 x 16 px local): per view, the per-image path and the
    batched path (workers return uint8 crops of each size, colour/flip per sample on the device)
    draw from the same law, crops included."""
    pipe = get_pipeline("multicrop", 32, num_global=2, num_local=2, local_size=16, mean=ZERO,
                        std=ONE)
    assert pipe.view_sizes == [32, 32, 16, 16]
    worker_fn, device_fn = pipe.split()
    img = colourful(3)
    n = 500
    torch.manual_seed(6)
    a = [torch.stack(v) for v in zip(*[pipe(img) for _ in range(n)])]
    torch.manual_seed(7)
    crops = [torch.stack(v) for v in zip(*[worker_fn(img) for _ in range(n)])]
    assert [tuple(c.shape[1:]) for c in crops] == [(3, 32, 32)] * 2 + [(3, 16, 16)] * 2
    assert all(c.dtype == torch.uint8 for c in crops)
    b = device_fn(crops, torch.Generator().manual_seed(8))
    for view in (0, 2):  # one global, one local view
        assert a[view].shape == b[view].shape
        sa, sb = _stats(a[view]), _stats(b[view])
        for key in sa:
            assert_same_law(sa[key], sb[key])
    # the local crops are another law than the global ones (the check can tell them apart)
    assert ks_statistic(_stats(a[0])["sharpness"], _stats(a[2])["sharpness"]) > ks_critical(n, n)
