"""recipes/bert_finetune.py and recipes/lrc_bert.py through the training engine (tiny sizes): the
run folder (model/, results.json, the GLUE evaluator in metrics.jsonl, keep-best), the five GLUE
file layouts, an exact resume, the registered methods, and no training loop outside the engine.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from contrastive.data.text_tasks import generated_tokenizer, load_task  # noqa: E402
from contrastive.engine import reset_accelerate_state  # noqa: E402
from contrastive.eval.classifier_folder import load_classifier  # noqa: E402
from contrastive.eval.glue import evaluate  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ["--log-every", "2", "--progress", "false", "--num-workers", "0", "--mixed-precision",
          "no", "--save-every-steps", "0"]
COMMON = ["--task", "generated", "--n-train", "64", "--n-dev", "32", "--batch-size", "8",
          *ENGINE]
TEACHER = ["--layers", "2", "--hidden", "16", "--heads", "2", "--intermediate-size", "0",
           "--lr", "1e-3"]
STUDENT = ["--layers", "1", "--hidden", "8", "--heads", "2", "--intermediate-size", "0",
           "--lr", "1e-3"]


def recipe(name: str) -> Any:
    key = f"recipe_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, ROOT / "recipes" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


def run(name: str, argv: list[str], out: Path) -> Any:
    """The recipe as a program, in this process."""
    reset_accelerate_state()
    try:
        return recipe(name).main([*argv, "--output-dir", str(out)])
    finally:
        reset_accelerate_state()


def records(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("teacher") / "t"
    run("bert_finetune", [*COMMON, *TEACHER, "--steps", "4", "--eval-every", "2",
                          "--keep-best", "glue_score"], out)
    return out


def test_defaults_are_the_papers() -> None:
    from contrastive.engine import parse_config

    ft = parse_config(recipe("bert_finetune").FinetuneConfig, [])
    assert (ft.optimizer, ft.lr, ft.batch_size, ft.lr_schedule, ft.lr_scaling) == (
        "adamw", 2e-5, 32, "linear", "none")
    assert (ft.weight_decay, ft.exclude_from_wd, ft.clip_grad_norm, ft.betas) == (
        0.01, True, 1.0, (0.9, 0.999))
    assert (ft.steps, ft.warmup_steps, ft.mixed_precision) == (1000, 100, "auto")  # 10 %
    assert (ft.layers, ft.hidden, ft.heads, ft.intermediate_size) == (12, 768, 12, 3072)
    lrc = parse_config(recipe("lrc_bert").LRCBertConfig, ["--teacher", "T"])
    assert (lrc.batch_size, lrc.temperature, lrc.stage1_fraction, lrc.perturb_scale) == (
        16, 1.1, 0.8, 1.0)
    assert (lrc.two_stage, lrc.perturb, lrc.layer_loss, lrc.lr) == (True, True, "cosnce", 5e-5)
    assert (lrc.layers, lrc.hidden, lrc.heads, lrc.intermediate_size) == (4, 312, 12, 1200)
    assert parse_config(recipe("lrc_bert").LRCBertConfig,
                        ["--teacher", "T", "--epochs", "3", "--steps", "0"]).warmup_epochs == \
        pytest.approx(0.3)


def test_finetune_then_distil(tmp_path: Path, teacher: Path, caplog) -> None:
    """model/ (safetensors + JSON + tokenizer) is the trained model: its dev metric equals the
    evaluator's in results.json and metrics.jsonl; the student's stages follow the schedule."""
    out = tmp_path / "s"
    with caplog.at_level(logging.INFO, logger="contrastive.engine.trainer"):
        res = run("lrc_bert", [*COMMON, *STUDENT, "--teacher", str(teacher / "model"),
                               "--steps", "5"], out)
    assert res.status == "completed" and res.step == 5
    assert ("completed at step 5: the classifier's settings (weights and tokenizer beside them) "
            f"in {out / 'model' / 'classifier.json'}") in caplog.text
    tok, task = generated_tokenizer(), load_task("generated", n_train=64, n_dev=32)
    for folder in (teacher, out):
        result = json.loads((folder / "results.json").read_text())
        model, meta = load_classifier(folder / "model")
        dev = evaluate(model, task.dev, tok, "sst2")
        assert result["dev"] == {f"glue_{k}": round(v, 6) for k, v in dev.items()}
        assert meta["step"] == result["step"] and result["task"] == "generated"
        last = [r for r in records(folder) if "glue_when" in r][-1]  # "end" or "step 4"
        assert last["step"] == result["step"] and last["glue_score"] == result["dev"]["glue_score"]
    assert json.loads((out / "results.json").read_text())["teacher_dev"] == \
        json.loads((teacher / "results.json").read_text())["dev"]
    assert load_classifier(out / "model")[0].encoder.num_layers == 1
    steps = [r for r in records(out) if "loss" in r]
    assert [r["stage"] for r in steps] == [1.0, 1.0, 2.0]  # steps 2, 4 in stage 1; 5 in 2
    assert "loss_soft" in steps[-1] and "loss_soft" not in steps[0]
    assert all("tokens_per_s" in r for r in steps)
    # the teacher's keep-best: best/ holds the model of the best evaluation
    evals = [r for r in records(teacher) if "glue_when" in r]
    assert [r["glue_when"] for r in evals] == ["step 2", "step 4"]
    best = json.loads((teacher / "best" / "results.json").read_text())
    assert best["dev"]["glue_score"] == max(r["glue_score"] for r in evals)


def test_teacher_of_another_task_is_refused(tmp_path: Path, teacher: Path) -> None:
    with pytest.raises(ValueError, match="predicts 2 labels"):
        run("lrc_bert", ["--task", "generated-nli", "--n-train", "9", "--teacher",
                         str(teacher / "model")], tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_resume_equals_the_uninterrupted_run(tmp_path: Path, teacher: Path) -> None:
    """LRC-BERT with dropout, across the stage switch (step 4 of 5) and an epoch end (8 steps
    per epoch, 10 steps): stopped by --max-steps 3, continued with --resume auto, it ends with
    the same weights, optimiser state and logged losses, each step logged once."""
    from safetensors.torch import load_file

    argv = [*COMMON, *STUDENT, "--teacher", str(teacher / "model"), "--steps", "10",
            "--log-every", "1", "--dropout", "0.2", "--eval-every", "3"]
    run("lrc_bert", argv, tmp_path / "a")
    run("lrc_bert", [*argv, "--max-steps", "3"], tmp_path / "b")
    torch.manual_seed(123)  # whatever happened in between: the checkpoint restores the generators
    res = run("lrc_bert", [*argv, "--resume", "auto"], tmp_path / "b")
    assert res.steps_trained == 7
    ckpt = "checkpoints/step_00000010"
    a, b = (load_file(str(tmp_path / d / ckpt / "model.safetensors")) for d in "ab")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    meta = [json.loads((tmp_path / d / ckpt / "meta.json").read_text())["fingerprints"]
            for d in "ab"]
    assert meta[0] == meta[1]
    losses = [[(r["step"], r["loss"]) for r in records(tmp_path / d) if "loss" in r] for d in "ab"]
    assert losses[0] == losses[1] and [s for s, _ in losses[1]] == list(range(1, 11))


# ---- the five GLUE layouts README lists -------------------------------------------------------

def _tsv(path: Path, rows: list[str], bom: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(("\ufeff" if bom else "") + "".join(r + "\n" for r in rows), encoding="utf-8")


def write_glue(root: Path, n: int = 16) -> Path:
    """Tiny GLUE files in the official layouts: SST-2 (one sentence, header), CoLA (no header,
    sentence in the 4th field), MRPC (byte-order mark, label first, ``#1 String``), STS-B
    (scores, ten columns), MNLI (``gold_label`` last, ``dev_matched.tsv``)."""
    words = ["great", "awful", "dull", "moving", "fine", "bad", "good", "poor"]
    for split in ("train", "dev"):
        m = n if split == "train" else n // 2
        _tsv(root / "SST-2" / f"{split}.tsv", ["sentence\tlabel"] + [
            f"the film was {words[i % 8]} \t{(i % 8) % 2}" for i in range(m)])
        _tsv(root / "CoLA" / f"{split}.tsv", [
            f"gj04\t{i % 2}\t{'' if i % 2 else '*'}\tthe film was {words[i % 8]} ." for i in range(m)])
        _tsv(root / "MRPC" / f"{split}.tsv", ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"] + [
            f"{i % 2}\t{i}\t{i + 1}\tthe film was {words[i % 8]} .\ta film is {words[(i + i % 2) % 8]} ."
            for i in range(m)], bom=True)
        sts = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
        _tsv(root / "STS-B" / f"{split}.tsv", [sts] + [
            f"{i}\tmain-captions\tMSRvid\t2012test\t{i:04d}\tnone\tnone\tA man is {words[i % 8]} .\t"
            f"A man was {words[(i * 3) % 8]} .\t{(i % 6) * 1.0:.3f}" for i in range(m)])
        head = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
                "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label")
        labels = ["entailment", "neutral", "contradiction"]
        _tsv(root / "MNLI" / ("train.tsv" if split == "train" else "dev_matched.tsv"), [head] + [
            f"{i}\t{i}\t{i}n\tslate\t(a)\t(b)\t(( a ))\t(( b ))\tthe film was {words[i % 8]} .\t"
            f"it was {words[(i + 1) % 8]} .\t{labels[i % 3]}\t{labels[i % 3]}" for i in range(m)])
    return root


GLUE_TASKS = {"sst2": {"glue_accuracy", "glue_score"}, "cola": {"glue_mcc", "glue_score"},
              "mrpc": {"glue_accuracy", "glue_f1", "glue_score"},
              "stsb": {"glue_pearson", "glue_spearman", "glue_score"},
              "mnli": {"glue_accuracy", "glue_score"}}


def test_the_five_glue_layouts(tmp_path: Path) -> None:
    """The teacher recipe on each layout for two steps (its dev metrics as GLUE reports them),
    and LRC-BERT on the regression task (MSE soft and hard losses) from its teacher."""
    glue = write_glue(tmp_path / "glue_data")
    tok = tmp_path / "tok"
    generated_tokenizer().save(tok)
    tiny = ["--glue-dir", str(glue), "--tokenizer", str(tok), "--batch-size", "4", "--steps",
            "2", *ENGINE]
    for task, keys in GLUE_TASKS.items():
        out = tmp_path / task
        run("bert_finetune", ["--task", task, *tiny, *TEACHER], out)
        res = json.loads((out / "results.json").read_text())
        assert res["task"] == task and set(res["dev"]) == keys, res
    meta = json.loads((tmp_path / "stsb" / "model" / "classifier.json").read_text())
    assert meta["regression"] and meta["num_labels"] == 1
    out = tmp_path / "lrc-stsb"
    run("lrc_bert", ["--task", "stsb", *tiny, *STUDENT, "--teacher",
                     str(tmp_path / "stsb" / "model"), "--stage1-fraction", "0.5"], out)
    assert set(json.loads((out / "results.json").read_text())["dev"]) == GLUE_TASKS["stsb"]
    last = [r for r in records(out) if "loss" in r][-1]
    assert last["stage"] == 2.0 and "loss_soft" in last and "loss_hard" in last


# ---- the methods' registry and the one training loop -------------------------------------------

def test_registered_methods() -> None:
    from contrastive.methods import LRCBert, TextClassifier, method_class

    assert method_class("text_classifier") is TextClassifier
    assert method_class("lrc_bert") is LRCBert


def _loop_calls(path: Path) -> list[str]:
    """``x.backward(...)`` and ``<optimiser or scheduler>.step(...)`` calls in a file's code
    (docstrings and comments do not count)."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            attr, owner = node.func.attr, ast.unparse(node.func.value).lower()
            if attr == "backward" or (attr == "step" and any(
                    w in owner.split(".")[-1] for w in ("opt", "sched"))):
                hits.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return hits


def test_no_training_loop_outside_the_engine() -> None:
    """Every recipe is a configuration of the engine: no code under recipes/ or contrastive/
    calls ``.backward(`` or an optimiser's ``.step(`` outside contrastive/engine/ and the two
    probes (contrastive/eval/linear/standard.py and the per-pixel contrastive/eval/segmentation.py:
    evaluation protocols with their own classifier on frozen features)."""
    probe_file = ROOT / "contrastive" / "eval" / "linear" / "standard.py"
    segmentation_probe = ROOT / "contrastive" / "eval" / "segmentation.py"
    allowed = (ROOT / "contrastive" / "engine", probe_file, segmentation_probe)
    hits = [h for folder in ("recipes", "contrastive")
            for path in sorted((ROOT / folder).rglob("*.py"))
            if not any(path == a or a in path.parents for a in allowed)
            for h in _loop_calls(path)]
    assert not hits, hits
    probe = _loop_calls(probe_file)
    assert any("backward" in h for h in probe) and any("optimizer.step" in h for h in probe)
    assert any("backward" in h for h in _loop_calls(segmentation_probe))


def test_glue_subset_and_held_out_rows(tmp_path: Path) -> None:
    """--train-rows (stratified subset), --held-out (rows never trained on) and --eval-on
    held_out (the evaluator scores them; results.json says so and has no dev figures)."""
    glue = write_glue(tmp_path / "glue_data", n=40)
    _tsv(glue / "SST-2" / "train.tsv", ["sentence\tlabel"] + [  # 40 distinct rows
        f"film {i} was {['great', 'awful'][i % 2]}\t{i % 2}" for i in range(40)])
    task = load_task("sst2", glue, train_rows=30, held_out=6, eval_on="held_out", seed=1)
    full = load_task("sst2", glue)
    assert (len(task.train), len(task.dev), task.eval_split) == (24, 6, "held_out")
    train_rows = set(zip(task.train.text_a, task.train.labels.tolist()))
    held_rows = set(zip(task.dev.text_a, task.dev.labels.tolist()))
    assert not train_rows & held_rows and (train_rows | held_rows) <= set(
        zip(full.train.text_a, full.train.labels.tolist()))
    assert sorted(task.dev.labels.tolist()) == [0, 0, 0, 1, 1, 1]  # stratified: half each
    same = load_task("sst2", glue, train_rows=30, held_out=6, seed=1)
    assert same.train.text_a == task.train.text_a and same.eval_split == "dev"
    assert len(same.dev) == len(full.dev)
    tok = tmp_path / "tok"
    generated_tokenizer().save(tok)
    out = tmp_path / "held"
    run("bert_finetune", ["--task", "sst2", "--glue-dir", str(glue), "--tokenizer", str(tok),
                          "--batch-size", "4", "--steps", "2", "--train-rows", "30",
                          "--held-out", "6", "--eval-on", "held_out", "--data-seed", "1",
                          *ENGINE, *TEACHER], out)
    res = json.loads((out / "results.json").read_text())
    assert "dev" not in res and set(res["held_out"]) == GLUE_TASKS["sst2"]
    resolved = json.loads((out / "config.json").read_text())["resolved"]
    assert resolved["train_examples"] == 24 and resolved["evaluated_on"] == "held_out"
    with pytest.raises(ValueError, match="held_out"):
        load_task("sst2", glue, eval_on="held_out")
    with pytest.raises(ValueError, match="generated"):
        load_task("generated", None, held_out=3)


def test_keep_layers_builds_a_student_from_a_deeper_models_layers(tmp_path: Path) -> None:
    """--keep-layers 1,3 on an hf: folder: a 2-layer encoder holding that model's layers 1, 3
    (issue 30's DistilBERT-style control); refused for a random-init 'bert'."""
    from contrastive.engine import LabelledTextConfig, parse_config
    from contrastive.nn.text_encoders import build_text_encoder, text_encoder

    torch.manual_seed(0)
    deep = build_text_encoder(num_layers=4, hidden_size=16, num_heads=2, vocab_size=60)
    deep.model.save_pretrained(tmp_path / "deep")
    cfg = parse_config(LabelledTextConfig, ["--keep-layers", "1,3"])
    small = text_encoder(f"hf:{tmp_path / 'deep'}", keep_layers=cfg.keep_layers)
    assert small.num_layers == 2
    for new, old in ((0, 1), (1, 3)):
        a, b = small.model.encoder.layer[new].state_dict(), deep.model.encoder.layer[old].state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="hf:FOLDER"):
        text_encoder("bert", keep_layers=cfg.keep_layers, vocab_size=60, **cfg.bert_sizes())
    with pytest.raises(SystemExit):  # one line on stderr, exit status 2
        parse_config(LabelledTextConfig, ["--keep-layers", "one"])
