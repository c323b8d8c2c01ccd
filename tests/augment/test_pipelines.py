"""Presets, registry, view shapes, the split() contract, per-sample parameters, determinism."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from contrastive.augment import (
    MultiView,
    Pipeline,
    UnknownPipelineError,
    ViewConfig,
    get_pipeline,
    list_pipelines,
    register_pipeline,
)

PRESETS = ["mocov1", "mocov2", "simclr", "byol", "mocov3", "multicrop", "eval"]


def _image(h=48, w=64, seed=0) -> torch.Tensor:
    return torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def test_registry_lists_the_presets():
    assert set(PRESETS) <= set(list_pipelines())
    assert list_pipelines() == sorted(list_pipelines())


def test_unknown_name_lists_close_matches():
    with pytest.raises(UnknownPipelineError, match="mocov2") as e:
        get_pipeline("mocov22")
    assert isinstance(e.value, KeyError)
    assert "Registered" in str(e.value)


def test_unknown_keyword_is_a_value_error_naming_accepted_ones():
    with pytest.raises(ValueError, match="blur_sigma"):
        get_pipeline("mocov2", blurr=0.5)


def test_aliases_and_dashes():
    assert get_pipeline("moco-v2", 32).views == get_pipeline("mocov2", 32).views


def test_register_a_custom_pipeline():
    @register_pipeline("test_only_flip")
    def _flip(image_size: int = 224, *, p: float = 1.0) -> Pipeline:
        return Pipeline([ViewConfig(size=image_size, flip_p=p)])

    pipe = get_pipeline("test_only_flip", 16, p=0.5)
    assert pipe.name == "test_only_flip" and pipe.views[0].flip_p == 0.5
    with pytest.raises(ValueError, match="already registered"):
        register_pipeline("test_only_flip")(_flip)


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("size", [224, 96, 32])
def test_every_preset_returns_its_views(name, size):
    pipe = get_pipeline(name, image_size=size)
    expected = {"eval": 1, "multicrop": 8}.get(name, 2)
    assert pipe.num_views == expected
    img = _image(300, 260) if size > 100 else _image(2 * size, 2 * size)
    pil = Image.fromarray(img.permute(1, 2, 0).numpy())
    for inp in (img, pil):
        views = pipe(inp)
        assert len(views) == expected
        assert [tuple(v.shape) for v in views] == [(3, s, s) for s in pipe.view_sizes]
        assert all(v.dtype == torch.float32 for v in views)
    worker_fn, device_fn = pipe.split()
    crops = worker_fn(pil)
    assert [c.dtype for c in crops] == [torch.uint8] * expected
    assert [tuple(c.shape) for c in crops] == [(3, s, s) for s in pipe.view_sizes]
    out = device_fn([c.unsqueeze(0).repeat(3, 1, 1, 1) for c in crops])
    assert [tuple(o.shape) for o in out] == [(3, 3, s, s) for s in pipe.view_sizes]
    assert all(o.dtype == torch.float32 for o in out)


def test_paper_values():
    v1 = get_pipeline("mocov1").views[0]
    assert (v1.brightness, v1.contrast, v1.saturation, v1.hue, v1.jitter_p) == (0.4, 0.4, 0.4, 0.4, 1.0)
    assert v1.grayscale_first and v1.grayscale_p == 0.2 and v1.scale == (0.2, 1.0) and v1.blur_p == 0
    v2 = get_pipeline("mocov2").views[0]
    assert (v2.brightness, v2.contrast, v2.saturation, v2.hue, v2.jitter_p) == (0.4, 0.4, 0.4, 0.1, 0.8)
    assert (v2.blur_p, v2.blur_sigma, v2.kernel_size, v2.scale) == (0.5, (0.1, 2.0), 23, (0.2, 1.0))
    cifar = get_pipeline("mocov2", 32).views[0]
    assert cifar.blur_p == 0.0 and cifar.scale == (0.08, 1.0)  # the MoCo CIFAR demo
    assert get_pipeline("mocov2", 96).views[0].kernel_size == 9
    s = get_pipeline("simclr", s=0.5).views[0]
    assert (s.brightness, s.contrast, s.saturation, s.hue) == pytest.approx((0.4, 0.4, 0.4, 0.1))
    assert get_pipeline("simclr", 32).views[0].brightness == pytest.approx(0.4)  # s = 0.5 on CIFAR
    for name in ("byol", "mocov3"):
        a, b = get_pipeline(name).views
        assert (a.blur_p, b.blur_p, a.solarize_p, b.solarize_p) == (1.0, 0.1, 0.0, 0.2)
        assert (a.saturation, a.hue, a.scale) == (0.2, 0.1, (0.08, 1.0))
    mc = get_pipeline("multicrop", num_local=4)
    assert mc.view_sizes == [224, 224, 96, 96, 96, 96]
    assert mc.views[2].scale == (0.05, 0.14)
    ev = get_pipeline("eval").views[0]
    assert ev.crop == "center" and ev.resize_size() == 256


def test_bad_arguments_are_value_errors():
    with pytest.raises(ValueError, match="hue"):
        get_pipeline("mocov2", hue=0.7)
    with pytest.raises(ValueError, match="jitter_p"):
        get_pipeline("mocov2", jitter_p=1.5)
    with pytest.raises(ValueError, match="blur_kernel_size"):
        get_pipeline("mocov2", blur_kernel_size=4)
    with pytest.raises(ValueError, match="image_size"):
        get_pipeline("mocov2", image_size=0)
    with pytest.raises(ValueError, match="blur_p and solarize_p"):
        get_pipeline("byol", blur_p=(1.0,))


def test_eval_is_deterministic_resize_and_centre_crop():
    img = _image(40, 60)
    pipe = get_pipeline("eval", 32)
    a, b = pipe(img)[0], pipe(img)[0]
    assert torch.equal(a, b)
    # reference: shorter side -> 32, then the central 32 x 32 of the 32 x 48 result
    from torchvision.transforms.v2 import functional as TF
    ref = TF.center_crop(TF.resize(img, [32, 48], antialias=True), [32, 32]).float() / 255
    mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
    torch.testing.assert_close(a, (ref - mean) / std, atol=1e-5, rtol=0)
    _, device_fn = pipe.split()
    crops = pipe.split()[0](img)
    torch.testing.assert_close(device_fn([crops[0][None]])[0][0], a, atol=1e-5, rtol=0)


def test_multiview_wrapper():
    calls = []

    def t(x):
        calls.append(x)
        return torch.rand(1)

    views = MultiView(t, 3)("img")
    assert len(views) == 3 and calls == ["img"] * 3 and not torch.equal(views[0], views[1])
    assert len(MultiView(get_pipeline("mocov2", 32), 2)(_image())) == 4
    with pytest.raises(ValueError, match="num_views"):
        MultiView(t, 0)


def test_device_fn_checks_its_input():
    _, device_fn = get_pipeline("mocov2", 32).split()
    x = torch.zeros(2, 3, 32, 32, dtype=torch.uint8)
    with pytest.raises(ValueError, match="expected a list of 2"):
        device_fn([x])
    with pytest.raises(ValueError, match="uint8"):
        device_fn([x.float(), x.float()])


def test_per_sample_parameters_differ_within_a_batch():
    """The same image 64 times: every sample must get its own colour distortion."""
    pipe = Pipeline([ViewConfig(size=32, scale=(1.0, 1.0), ratio=(1.0, 1.0), jitter_p=1.0,
                                brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1)])
    _, device_fn = pipe.split()
    img = _image(32, 32)
    out = device_fn([img.unsqueeze(0).repeat(64, 1, 1, 1)], torch.Generator().manual_seed(0))[0]
    flat = out.flatten(1)
    distinct = (flat[:, None] - flat[None]).abs().amax(-1) > 1e-3
    assert distinct.sum() == 64 * 63  # all pairs differ (the diagonal does not)
    means = out.mean(dim=(1, 2, 3))
    assert means.std() > 0.05


@pytest.mark.parametrize("name, kwargs", [("byol", {"blur_p": (1.0, 0.5)}), ("mocov1", {}),
                                          ("simclr", {"jitter_order": "fixed", "blur_p": 0.5})])
def test_device_fn_is_deterministic_and_strategy_independent(name, kwargs):
    """Same generator state -> same views, whatever the chunk size or strategy (dense masks on
    the whole batch vs sorted groups on subsets)."""
    pipe = get_pipeline(name, 32, **kwargs)
    _, device_fn = pipe.split()
    views = [torch.randint(0, 256, (9, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(i))
             for i in range(2)]
    a = device_fn(views, torch.Generator().manual_seed(5))
    b = device_fn(views, torch.Generator().manual_seed(5))
    c = device_fn(views, torch.Generator().manual_seed(6))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0])
    for chunk, strategy in ((1, None), (4, "grouped"), (9, "grouped"), (None, "dense")):
        dev = type(device_fn)(pipe.views, pipe.mean, pipe.std, chunk_size=chunk, strategy=strategy)
        d = dev(views, torch.Generator().manual_seed(5))
        for x, y in zip(a, d):
            torch.testing.assert_close(x, y, atol=1e-4, rtol=0)


def test_per_image_path_is_deterministic_under_the_global_seed():
    pipe = get_pipeline("mocov2", 32)
    img = _image()
    torch.manual_seed(1)
    a = pipe(img)
    torch.manual_seed(1)
    b = pipe(img)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], a[1])  # two views, independent draws


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_device_path_matches_the_cpu():
    """Same parameters (a CPU generator) on both devices: the GPU (grouped convolutions, one
    chunk) and the CPU (shifted sums, small chunks) compute the same views."""
    pipe = get_pipeline("byol", 64, blur_p=(1.0, 0.5))
    _, device_fn = pipe.split()
    views = [torch.randint(0, 256, (33, 3, 64, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(i))
             for i in range(2)]
    cpu = device_fn(views, torch.Generator().manual_seed(3))
    gpu = device_fn([v.cuda() for v in views], torch.Generator().manual_seed(3))
    for a, b in zip(cpu, gpu):
        assert b.device.type == "cuda" and b.dtype == torch.float32
        torch.testing.assert_close(b.cpu(), a, atol=1e-4, rtol=0)
    on_gpu = device_fn([v.cuda() for v in views], torch.Generator(device="cuda").manual_seed(3))
    again = device_fn([v.cuda() for v in views], torch.Generator(device="cuda").manual_seed(3))
    assert all(torch.equal(a, b) for a, b in zip(on_gpu, again))


def test_batched_training_and_evaluation_views_do_not_import_torchvision():
    """A run on the batched path with a torch-only encoder never imports torchvision (with it
    comes torch._dynamo, through torchvision.ops: seconds of CPU for a process that builds no
    optimiser): its crops, the evaluation view and ``small_cnn`` are torch-only; the per-image
    colour operations import it when they are built."""
    import subprocess
    import sys

    code = """
import sys, torch
from contrastive.augment import get_pipeline
from contrastive.nn import create_encoder
create_encoder("small_cnn")
img = torch.randint(0, 256, (3, 40, 30), dtype=torch.uint8)
worker_fn, device_fn = get_pipeline("mocov2", image_size=16).split()
device_fn([v[None] for v in worker_fn(img)])
get_pipeline("eval", image_size=16)(img)
assert "torchvision" not in sys.modules, "torchvision imported"
get_pipeline("mocov2", image_size=16)(img)
assert "torchvision" in sys.modules
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]
