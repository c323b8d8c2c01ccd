"""The manual's "Add a method: one file" example (docs/concepts/methods.md) runs as written:
registered, built by name, trained for two steps by the engine."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from contrastive.methods import get_method, list_methods
from contrastive.methods import registry as method_registry

PAGE = Path(__file__).resolve().parents[2] / "docs" / "concepts" / "methods.md"


def _example() -> str:
    text = PAGE.read_text(encoding="utf-8")
    marker = "<!-- docs-method-example"
    assert marker in text, f"{PAGE} lost its method example marker"
    block = re.search(r"```python\n(.*?)```", text[text.index(marker):], re.S)
    return block.group(1)


def test_docs_method_example_registers_and_trains(tmp_path, monkeypatch, fresh_accelerate):
    monkeypatch.setattr(method_registry, "_REGISTRY", method_registry._REGISTRY.copy())
    namespace: dict = {"__name__": "readme_example"}
    exec(compile(_example(), str(PAGE), "exec"), namespace)
    assert "alignuniform" in list_methods()
    method = get_method("align_uniform", dim=8)
    out = method(method.make_batch([torch.randn(4, 3, 16, 16), torch.randn(4, 3, 16, 16)]))
    assert out["loss"].requires_grad and torch.isfinite(out["loss"])

    from contrastive.augment import get_pipeline
    from contrastive.engine import ImageConfig, train

    cfg = ImageConfig(data="synthetic:n=32,size=16", encoder="small_cnn", image_size=16,
                      batch_size=16, epochs=1, max_steps=2, num_workers=0, progress=False,
                      mixed_precision="no", log_every=1, output_dir=str(tmp_path / "run"))
    result = train(cfg, lambda c, data: get_method("align_uniform", encoder=c.encoder, dim=8),
                   lambda c: get_pipeline("simclr", c.image_size), recipe="readme")
    assert result.status == "max_steps" and result.step == 2
    assert "align" in result.last_metrics and result.encoder_path.is_file()
