#!/usr/bin/env python
"""kNN of a ViT recipe's encoder on several token features, trained against random init.

Runs ``recipes/<recipe>.py`` in this process with the given flags (the engine, as the recipe's
own command line does), keeps a copy of the method at initialisation, and after training
measures weighted-kNN top-1 (the toolkit's kNN monitor: k 200, t 0.1, evaluation transform)
of the class token and of the mean of the patch tokens (timm's ``global_pool="avg"`` features,
here after the final norm) of the student encoder, of the EMA teacher's encoder when the
method has one (DINO, iBOT; MSN's target encoder), and of the same encoder at random
initialisation. Prints one JSON line and writes it to ``knn_features.json`` in the run folder.

    python benchmarks/vit_knn_features.py ibot_cifar --data imagefolder:DIR ... --output-dir D

Used to choose the settings and the feature of the learning checks of issue 33
(tests/recipes/test_learning_ibot.py, test_learning_mae.py), and the program of MSN's
(tests/recipes/test_learning_msn.py: MSN evaluates its target encoder, which the kNN monitor
does not see); figures in benchmarks/results/methods.md. Bank and queries:
``--knn-max-train`` / ``--knn-max-test``.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
import time
from pathlib import Path

import torch
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parents[1]


def load_recipe(name: str):
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", ROOT / "recipes" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = mod  # type: ignore[union-attr]  # dataclasses look it up
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def token_features(vit: nn.Module, which: str):
    """``cls``: the class token; ``avg``: the mean of the patch tokens (both after the norm)."""
    def encode(x: Tensor) -> Tensor:
        tokens = vit.forward_features(x)  # type: ignore[operator]
        prefix = int(getattr(vit, "num_prefix_tokens", 1))
        return tokens[:, 0] if which == "cls" else tokens[:, prefix:].mean(1)
    return encode


def teacher_encoder(method: nn.Module) -> nn.Module | None:
    """The EMA teacher's copy of the encoder: iBOT's ``teacher.module["encoder"]``, DINO's and
    MSN's ``teacher.module[0]`` (encoder, head); None without a teacher."""
    teacher = getattr(method, "teacher", None)
    if teacher is None:
        return None
    parts = teacher.module
    return parts["encoder"] if isinstance(parts, nn.ModuleDict) else parts[0]


def main(argv: list[str]) -> None:
    from contrastive.augment import get_pipeline
    from contrastive.data import get_dataset, num_classes
    from contrastive.engine import run
    from contrastive.engine.kits.image import KNNEvaluator

    recipe, args = argv[0], argv[1:]
    mod = load_recipe(recipe)
    config_cls = next(v for k, v in vars(mod).items() if isinstance(v, type)
                      and k.endswith("Cifar") and v.__module__ == mod.__name__)
    kept: dict[str, nn.Module] = {}
    kept_cfg: dict[str, object] = {}

    def build(cfg, data):
        method = mod.build_method(cfg, data)
        kept["init"], kept["trained"] = copy.deepcopy(method), method
        kept_cfg["cfg"] = cfg
        return method

    t0 = time.time()
    run(config_cls, build, mod.build_pipeline, argv=args, name=recipe)
    train_s = time.time() - t0
    cfg: object = kept_cfg["cfg"]
    pipeline = mod.build_pipeline(cfg)
    norm = {k: getattr(pipeline, k) for k in ("mean", "std") if hasattr(pipeline, k)}
    eval_tf = get_pipeline("eval", image_size=cfg.image_size, **norm)  # type: ignore[attr-defined]
    bank = get_dataset(cfg.data, "train", transform=eval_tf)  # type: ignore[attr-defined]
    query = get_dataset(cfg.data, "test", transform=eval_tf)  # type: ignore[attr-defined]
    knn = KNNEvaluator(bank, query, k=200, t=0.1,
                       max_bank=cfg.knn_max_train,  # type: ignore[attr-defined]
                       max_query=cfg.knn_max_test,  # type: ignore[attr-defined]
                       batch_size=256, num_workers=0, num_classes=num_classes(bank))
    encoders = {"init": kept["init"].encoder, "student": kept["trained"].encoder}
    teacher = teacher_encoder(kept["trained"])
    if teacher is not None:
        encoders["teacher"] = teacher
    out: dict[str, object] = {"recipe": recipe, "args": " ".join(args),
                              "train_s": round(train_s, 1)}
    with torch.no_grad():
        for name, vit in encoders.items():
            vit.eval()
            for which in ("cls", "avg"):
                out[f"{name}_{which}"] = round(knn.top1(token_features(vit, which), None), 2)
    line = json.dumps(out)
    run_dir = Path(cfg.output_dir)  # type: ignore[attr-defined]
    (run_dir / "knn_features.json").write_text(line + "\n")
    print(line, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
