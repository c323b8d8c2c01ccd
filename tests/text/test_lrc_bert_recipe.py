"""recipes/bert_finetune.py and recipes/lrc_bert.py end to end on the generated task (tiny
sizes), the saved models, and the text loop's exact resume."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from contrastive.data.text_tasks import generated_tokenizer, load_task  # noqa: E402
from contrastive.methods.text_classifier import TextClassifier, evaluate, load_classifier  # noqa: E402
from contrastive.nn.text_encoders import build_text_encoder  # noqa: E402
from contrastive.text.loop import TextTrainConfig, train_text  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
COMMON = ["--task", "generated", "--n-train", "64", "--n-dev", "32", "--batch-size", "8",
          "--log-every", "2", "--device", "cpu"]


def _recipe(name: str):
    sys.path.insert(0, str(ROOT / "recipes"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "recipes" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_finetune_then_distil(tmp_path: Path) -> None:
    teacher = _recipe("bert_finetune").main(
        COMMON + ["--layers", "2", "--hidden", "16", "--heads", "2", "--steps", "4", "--lr",
                  "1e-3", "--output-dir", str(tmp_path / "t")])
    student = _recipe("lrc_bert").main(
        COMMON + ["--teacher", str(tmp_path / "t" / "model"), "--layers", "1", "--hidden", "8",
                  "--heads", "2", "--steps", "5", "--lr", "1e-3", "--output-dir",
                  str(tmp_path / "s")])
    for res, folder in ((teacher, "t"), (student, "s")):
        assert 0.0 <= res["dev"]["accuracy"] <= 1.0
        assert json.loads((tmp_path / folder / "results.json").read_text()) == res
        model, meta = load_classifier(tmp_path / folder / "model")  # safetensors + JSON
        tok = generated_tokenizer()
        task = load_task("generated", n_train=64, n_dev=32)
        assert evaluate(model, task.dev, tok, "sst2") == res["dev"]  # the saved model is it
    records = [json.loads(ln) for ln in (tmp_path / "s" / "metrics.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in records] == [1.0, 1.0, 2.0]  # steps 2, 4 in stage 1; 5 in 2
    assert "loss_soft" in records[-1] and "loss_soft" not in records[0]
    assert student["dev"] and load_classifier(tmp_path / "s" / "model")[0].encoder.num_layers == 1
    with pytest.raises(ValueError, match="predicts 2 labels"):
        _recipe("lrc_bert").main(["--task", "generated-nli", "--n-train", "9", "--teacher",
                                  str(tmp_path / "t" / "model"), "--output-dir",
                                  str(tmp_path / "x")])


def _tiny():
    torch.manual_seed(0)
    enc = build_text_encoder(num_layers=1, hidden_size=8, num_heads=2, vocab_size=400,
                             max_position_embeddings=64, dropout=0.3)
    return TextClassifier(enc, 2, dropout=0.3)


def test_resume_continues_exactly(tmp_path: Path) -> None:
    tok = generated_tokenizer()
    data = load_task("generated", n_train=40, n_dev=8).train
    cfg = TextTrainConfig(steps=6, batch_size=8, lr=1e-2, log_every=1)  # 5 steps per epoch
    straight = _tiny()
    train_text(straight, data, tok.collate, cfg, tmp_path / "a")
    resumed = _tiny()
    train_text(resumed, data, tok.collate, cfg, tmp_path / "b", max_steps=3)
    torch.manual_seed(123)  # whatever happened in between: the checkpoint restores the generators
    train_text(resumed, data, tok.collate, cfg, tmp_path / "b", resume=True)
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    meta = json.loads((tmp_path / "b" / "checkpoint" / "meta.json").read_text())
    assert meta["step"] == 6 and set(meta["files"]) == {"model.safetensors", "optimizer.pt",
                                                         "rng.pt"}
    lines = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(ln)["step"] for ln in lines] == [1, 2, 3, 4, 5, 6]


def test_regression_and_glue_tsv_paths(tmp_path: Path) -> None:
    """STS-like regression (MSE, Pearson / Spearman) and a GLUE task read from official TSVs."""
    tiny = ["--layers", "1", "--hidden", "8", "--heads", "2", "--steps", "3", "--batch-size", "4",
            "--lr", "1e-3", "--device", "cpu", "--log-every", "3"]
    sts = _recipe("bert_finetune").main(["--task", "generated-sts", "--n-train", "16", "--n-dev",
                                         "8", *tiny, "--output-dir", str(tmp_path / "t")])
    assert set(sts["dev"]) == {"pearson", "spearman", "score"}
    assert load_classifier(tmp_path / "t" / "model")[0].regression
    lrc = _recipe("lrc_bert").main(["--task", "generated-sts", "--n-train", "16", "--n-dev", "8",
                                    "--teacher", str(tmp_path / "t" / "model"), *tiny,
                                    "--output-dir", str(tmp_path / "s")])
    assert set(lrc["dev"]) == {"pearson", "spearman", "score"}
    glue = tmp_path / "glue_data" / "SST-2"
    glue.mkdir(parents=True)
    rows = ["sentence\tlabel"] + [f"the film was {w} \t{y}" for w, y in
                                  [("great", 1), ("awful", 0), ("dull", 0), ("moving", 1)] * 2]
    for split in ("train", "dev"):
        (glue / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    generated_tokenizer().save(tmp_path / "tok")
    res = _recipe("bert_finetune").main(["--task", "sst2", "--glue-dir", str(tmp_path / "glue_data"),
                                         "--tokenizer", str(tmp_path / "tok"), *tiny,
                                         "--output-dir", str(tmp_path / "g")])
    assert res["task"] == "sst2" and set(res["dev"]) == {"accuracy", "score"}
    with pytest.raises(ValueError, match="--glue-dir"):
        _recipe("bert_finetune").main(["--task", "sst2", *tiny, "--output-dir", str(tmp_path / "x")])
