"""Hugging Face / sentence-transformers folders: export round trips on tiny random models
(transformers' own classes read them back to 1e-5), contrastive-sts-eval following a
sentence-transformers folder's own pooling (a generated folder; the real all-MiniLM-L6-v2 on the
real STS-B dev set in the slow check), and a text run's model/ opened directly by transformers
(a classifier) and sentence-transformers (SimCSE), the first classifier layout still read."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from contrastive.data.text_tasks import generated_tokenizer  # noqa: E402
from contrastive.eval.classifier_folder import save_classifier  # noqa: E402
from contrastive.eval.export_text import export_classifier, export_sentence_encoder  # noqa: E402
from contrastive.eval.sts import evaluate_sts, load_sts_pairs  # noqa: E402
from contrastive.eval.sts import main as sts_main  # noqa: E402
from contrastive.methods.text_classifier import TextClassifier  # noqa: E402
from contrastive.nn.hf_folders import read_sentence_pooling  # noqa: E402
from contrastive.nn.text_encoders import TextEncoder, build_text_encoder  # noqa: E402

SENTENCES = ["the film was great , not dull", "an awful plot", "moving and warm , a fine cast"]
DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
MINILM, STSB = DATA / "text-models" / "all-MiniLM-L6-v2", DATA / "glue" / "STS-B"


@pytest.fixture(scope="module")
def tok():
    return generated_tokenizer(max_length=32)


def _encoder(tok, pooling: str = "auto", seed: int = 0) -> TextEncoder:
    torch.manual_seed(seed)
    return build_text_encoder(num_layers=1, hidden_size=32, num_heads=2, intermediate_size=64,
                              vocab_size=tok.vocab_size, max_position_embeddings=64,
                              pooling=pooling).eval()


def _no_pickles(folder: Path) -> None:
    names = [p.name for p in folder.rglob("*") if p.is_file()]
    assert not [n for n in names if n.endswith((".bin", ".pt", ".pth", ".pkl", ".ckpt"))], names


def _load(cls, folder: Path):
    return cls.from_pretrained(str(folder), local_files_only=True, use_safetensors=True).eval()


@pytest.mark.parametrize("num_labels, regression", [(3, False), (1, True)])
def test_classifier_round_trip_auto_classes(tok, tmp_path: Path, num_labels, regression):
    model = TextClassifier(_encoder(tok), num_labels, regression=regression).eval()
    with torch.no_grad():
        model.head.weight.normal_()  # not the zero-ish init: a wrong mapping shows
    names = None if regression else ["entailment", "neutral", "contradiction"]
    out = export_classifier(model, tmp_path / "hf", tok, label_names=names)
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in out.iterdir()}
    _no_pickles(out)
    batch = tok(SENTENCES)
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    theirs_ids = hf_tok(SENTENCES, padding=True, truncation=True, return_tensors="pt")
    assert all(torch.equal(batch[k], theirs_ids[k]) for k in batch)  # the same token ids
    with torch.no_grad():
        ours = model.encoder.encode(**batch).hidden_states[-1]
        base = _load(transformers.AutoModel, out)(**batch).last_hidden_state
        torch.testing.assert_close(base, ours, atol=1e-5, rtol=0)
        seq = _load(transformers.AutoModelForSequenceClassification, out)
        torch.testing.assert_close(seq(**batch).logits, model.predict(batch), atol=1e-5, rtol=0)
    assert seq.config.problem_type == ("regression" if regression
                                       else "single_label_classification")
    if names:
        assert seq.config.id2label == dict(enumerate(names))


def test_classifier_on_cls_pooling_exports_the_encoder_only(tok, tmp_path: Path):
    model = TextClassifier(_encoder(tok, pooling="cls"), 2).eval()
    with pytest.raises(ValueError, match="encoder only"):
        export_classifier(model, tmp_path / "x", tok)
    out = export_classifier(model, tmp_path / "enc", tok, head=False)
    batch = tok(SENTENCES)
    with torch.no_grad():
        base = _load(transformers.AutoModel, out)(**batch)
        torch.testing.assert_close(base.last_hidden_state[:, 0], model.encoder(batch),
                                   atol=1e-5, rtol=0)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertModel"]


@pytest.mark.parametrize("pooling, normalize", [("cls", False), ("mean", True), ("pooler", False)])
def test_sentence_transformers_folder_round_trip(tok, tmp_path: Path, pooling, normalize):
    """The folder read back by this package's reader (contrastive-sts-eval's) and its encoder
    by transformers' AutoModel (sentence-transformers itself reads a run's model/ below)."""
    encoder = _encoder(tok, pooling=pooling)
    out = export_sentence_encoder(encoder, tmp_path / "st", tok, normalize=normalize)
    _no_pickles(out)
    modules = json.loads((out / "modules.json").read_text())
    kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
    assert kinds == ["Transformer", "Pooling", *(["Dense"] if pooling == "pooler" else []),
                     *(["Normalize"] if normalize else [])]
    cfg = json.loads((out / "1_Pooling" / "config.json").read_text())
    assert cfg["word_embedding_dimension"] == 32
    assert cfg["pooling_mode_mean_tokens"] is (pooling == "mean")
    assert cfg["pooling_mode_cls_token"] is (pooling != "mean")
    pipeline = read_sentence_pooling(out)
    batch = tok(SENTENCES)
    with torch.no_grad():
        hidden = _load(transformers.AutoModel, out)(**batch).last_hidden_state
        theirs = pipeline.pool(hidden, batch["attention_mask"])
        ours = encoder(batch)
    torch.testing.assert_close(theirs, torch.nn.functional.normalize(ours, dim=-1) if normalize
                               else ours, atol=1e-5, rtol=0)


def _st_folder(tok, root: Path, modes: dict[str, bool], normalize: bool = False) -> Path:
    """A sentence-transformers-style folder as the library writes it, by hand: a tiny random
    BERT (save_pretrained), tokenizer.json, modules.json, 1_Pooling/config.json."""
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=tok.vocab_size, hidden_size=32,
                                     num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64)
    transformers.BertModel(config).save_pretrained(str(root), safe_serialization=True)
    tok.save(root)
    modules = [{"idx": 0, "name": "0", "path": "",
                "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
    (root / "modules.json").write_text(json.dumps(modules))
    (root / "1_Pooling").mkdir()
    (root / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": 32, "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False, **modes}))
    (root / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 24}))
    return root


def _sts(capsys, argv: list[str]) -> dict:
    capsys.readouterr()
    assert sts_main(argv) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_sts_eval_follows_the_folders_pooling(tok, tmp_path: Path, capsys):
    folder = _st_folder(tok, tmp_path / "st", {"pooling_mode_mean_tokens": True}, normalize=True)
    common = ["--model", str(folder), "--data", "generated", "--n", "60"]
    line = _sts(capsys, common)
    assert line["pooling"] == "mean+normalize" and "1_Pooling" in line["pooling_from"]
    # the same figure as the encoder with mean pooling (what the folder says), not the default
    a, b, gold = load_sts_pairs("generated", n=60)
    enc = TextEncoder(transformers.BertModel.from_pretrained(str(folder)), pooling="mean")
    assert line["spearman"] == pytest.approx(evaluate_sts(enc, tok, a, b, gold)["spearman"],
                                             abs=1e-9)
    override = _sts(capsys, [*common, "--pooling", "cls"])  # the flag still wins
    assert override["pooling"] == "cls" and override["pooling_from"] == "--pooling"
    enc.pooling = "cls"
    assert override["spearman"] == pytest.approx(
        evaluate_sts(enc, tok, a, b, gold)["spearman"], abs=1e-9)


def test_sts_eval_max_pooling_and_unknown_modules(tok, tmp_path: Path, capsys):
    folder = _st_folder(tok, tmp_path / "st", {"pooling_mode_max_tokens": True})
    line = _sts(capsys, ["--model", str(folder), "--data", "generated", "--n", "40"])
    assert line["pooling"] == "max"
    mods = json.loads((folder / "modules.json").read_text())
    mods.append({"idx": 2, "name": "2", "path": "2_LayerNorm",
                 "type": "sentence_transformers.models.LayerNorm"})
    (folder / "modules.json").write_text(json.dumps(mods))
    with pytest.raises(SystemExit) as exc:
        sts_main(["--model", str(folder), "--data", "generated", "--n", "40"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "LayerNorm" in err[-1] and "--pooling" in err[-1] and "Traceback" not in "\n".join(err)


def test_contrastive_export_cli_text_formats(tok, tmp_path: Path, capsys):
    from contrastive.eval.cli import export_main

    model = TextClassifier(_encoder(tok), 2).eval()
    save_classifier(tmp_path / "teacher", model, tok, task="sst2")
    assert export_main(["--checkpoint", str(tmp_path / "teacher"), "--format", "hf",
                        "--out", str(tmp_path / "hf")]) == 0
    seq = _load(transformers.AutoModelForSequenceClassification, tmp_path / "hf")
    assert seq.config.id2label == {0: "negative", 1: "positive"}
    batch = tok(SENTENCES)
    with torch.no_grad():
        torch.testing.assert_close(seq(**batch).logits, model.predict(batch), atol=1e-5, rtol=0)
    assert export_main(["--checkpoint", str(tmp_path / "teacher"), "--format",
                        "sentence-transformers", "--pooling", "mean",
                        "--out", str(tmp_path / "st")]) == 0
    assert read_sentence_pooling(tmp_path / "st").modes == ("mean",)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        export_main(["--checkpoint", str(tmp_path / "st"), "--format", "hf",
                     "--out", str(tmp_path / "x")])
    assert exc.value.code == 2 and "classifier.json" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(not (MINILM / "modules.json").is_file() or not (STSB / "dev.tsv").is_file(),
                    reason=f"real data absent: needs {MINILM} and {STSB}/dev.tsv "
                           "(../shared/data, see its README)")
def test_real_minilm_on_stsb_dev_follows_its_mean_pooling(capsys):
    """all-MiniLM-L6-v2 (mean pooling + Normalize in its own folder) on the real STS-B dev set:
    0.867 with no --pooling (issue #28: 0.867 with --pooling mean, 0.793 with the old default,
    the pooler). About 30 s alone on a 2-core AVX-512 CPU, one thread."""
    start = time.time()
    line = _sts(capsys, ["--model", str(MINILM), "--data", str(STSB)])
    assert line["pooling"] == "mean+normalize" and line["n"] == 1500
    assert line["spearman"] == pytest.approx(0.867, abs=0.002), line
    print(f"real STS-B dev: {line['spearman']:.4f} in {time.time() - start:.0f} s")


# ---- a text run's model/ opens in transformers and sentence-transformers ----------------------

ROOT = Path(__file__).resolve().parents[2]
# tiny runs (benchmarks/recipe_digests.py's sizes): a 1-layer BERT, a few steps
RUN = ["--layers", "1", "--hidden", "16", "--heads", "2", "--batch-size", "8", "--lr", "1e-3",
       "--warmup-steps", "2", "--steps", "3", "--log-every", "1", "--progress", "false",
       "--num-workers", "0", "--mixed-precision", "no", "--save-every-steps", "0"]


def _run(name: str, *args: str) -> Path:
    """recipes/<name>.py's ``main`` in this process; returns its ``model/``."""
    import importlib.util
    import sys

    from contrastive.engine import reset_accelerate_state

    spec = importlib.util.spec_from_file_location(f"recipe_{name}", ROOT / "recipes" / f"{name}.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    reset_accelerate_state()
    try:
        module.main([*RUN, *args])
    finally:
        reset_accelerate_state()
    return Path(args[args.index("--output-dir") + 1]) / "model"


def test_classifier_run_opens_with_auto_model_for_sequence_classification(tmp_path: Path):
    """bert_finetune's model/ in transformers: its tokenizer's ids, its logits equal ours (1e-5)
    and its dev metrics the ones the run recorded in results.json."""
    from contrastive.data.glue import glue_metrics
    from contrastive.data.text_tasks import load_task
    from contrastive.eval.classifier_folder import load_classifier

    model_dir = _run("bert_finetune", "--task", "generated", "--n-train", "64", "--n-dev", "32",
                     "--intermediate-size", "0", "--eval-at-start", "false",
                     "--output-dir", str(tmp_path / "run"))
    meta = json.loads((model_dir / "classifier.json").read_text())
    assert meta["layout"] == "sequence_classification" and "encoder_config" not in meta
    _no_pickles(model_dir)
    dev = load_task("generated", n_train=64, n_dev=32).dev
    texts, labels = [x["text_a"] for x in dev], torch.tensor([x["label"] for x in dev])
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    batch = dict(hf_tok(texts, padding=True, truncation=True, return_tensors="pt"))
    seq = _load(transformers.AutoModelForSequenceClassification, model_dir)
    assert seq.config.id2label == {0: "negative", 1: "positive"}
    ours, _ = load_classifier(model_dir)
    with torch.no_grad():
        logits = seq(**batch).logits
        torch.testing.assert_close(logits, ours.eval().predict(batch), atol=1e-5, rtol=0)
    recorded = json.loads((tmp_path / "run" / "results.json").read_text())["dev"]
    metrics = glue_metrics("sst2", logits.numpy(), labels.numpy())
    assert {f"glue_{k}": v for k, v in metrics.items()} == pytest.approx(recorded)


def test_simcse_run_opens_with_sentence_transformer(tmp_path: Path):
    """simcse's model/ (supervised: the MLP kept at test, a Dense module after [CLS]) in
    sentence-transformers: the embeddings of our encoder with the run's pooling (1e-5)."""
    st = pytest.importorskip("sentence_transformers")
    from contrastive.data.tokenizer import load_tokenizer
    from contrastive.nn.text_encoders import load_text_encoder

    model_dir = _run("simcse", "--mode", "sup", "--n-train", "160", "--vocab-size", "300",
                     "--intermediate", "32", "--eval", "none",
                     "--output-dir", str(tmp_path / "run"))
    pooling = json.loads((model_dir / "simcse.json").read_text())["pooling"]
    assert pooling == "pooler" and (model_dir / "2_Dense" / "model.safetensors").is_file()
    _no_pickles(model_dir)
    theirs = st.SentenceTransformer(str(model_dir), device="cpu", local_files_only=True).encode(
        SENTENCES, convert_to_tensor=True)
    encoder = load_text_encoder(model_dir, pooling=pooling).eval()
    with torch.no_grad():
        ours = encoder(load_tokenizer(model_dir)(SENTENCES))
    torch.testing.assert_close(theirs.cpu(), ours, atol=1e-5, rtol=0)


def _old_layout(model: TextClassifier, tok, folder: Path, **info) -> Path:
    """A classifier folder as main at ab30eff wrote it: the classifier's own state dict and
    classifier.json with the encoder's config, no config.json."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              str(folder / "model.safetensors"))
    (folder / "classifier.json").write_text(json.dumps({
        "num_labels": model.num_labels, "regression": model.regression,
        "pooling": model.encoder.pooling, "encoder_config": model.encoder.config.to_dict(),
        **info}))
    tok.save(folder)
    return folder


def test_old_layout_folders_still_load_and_export(tok, tmp_path: Path):
    """A folder of the first layout loads (load_classifier: --teacher and export read it) with
    the same weights and the same random draws as a folder of today's layout, and exports."""
    from contrastive.eval.classifier_folder import load_classifier
    from contrastive.eval.cli import export_main

    model = TextClassifier(_encoder(tok), 2).eval()
    with torch.no_grad():
        model.head.weight.normal_()
    old = _old_layout(model, tok, tmp_path / "old", task="sst2", step=4, dev={"accuracy": 50.0})
    new = save_classifier(tmp_path / "new", model, tok, task="sst2", step=4)
    assert not (old / "config.json").is_file() and (new / "config.json").is_file()
    draws, batch = [], tok(SENTENCES)
    for folder in (old, new):
        torch.manual_seed(0)
        loaded, meta = load_classifier(folder)
        draws.append(torch.rand(3))  # a run seeded before loading its teacher is unchanged
        assert meta["task"] == "sst2" and meta["step"] == 4
        with torch.no_grad():
            torch.testing.assert_close(loaded.eval().predict(batch), model.predict(batch),
                                       atol=0, rtol=0)
    torch.testing.assert_close(draws[0], draws[1], atol=0, rtol=0)
    assert export_main(["--checkpoint", str(old), "--format", "hf", "--out",
                        str(tmp_path / "hf")]) == 0
    with torch.no_grad():
        torch.testing.assert_close(_load(transformers.AutoModelForSequenceClassification,
                                         tmp_path / "hf")(**batch).logits, model.predict(batch),
                                   atol=1e-5, rtol=0)


def test_classifier_without_pooler_head_saves_the_encoder_and_its_head_beside(tok, tmp_path):
    """cls pooling (no counterpart in BertForSequenceClassification): an AutoModel folder with
    the prediction layer in classifier_head.safetensors; saving draws no random numbers; a
    re-save with the pooler head removes that file."""
    from contrastive.eval.classifier_folder import load_classifier

    model = TextClassifier(_encoder(tok, pooling="cls"), 3).eval()
    torch.manual_seed(1)
    expected = torch.rand(2)
    torch.manual_seed(1)
    folder = save_classifier(tmp_path / "m", model, tok)
    torch.testing.assert_close(torch.rand(2), expected, atol=0, rtol=0)
    assert json.loads((folder / "classifier.json").read_text())["layout"] == "encoder"
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["BertModel"]
    batch = tok(SENTENCES)
    with torch.no_grad():
        hidden = _load(transformers.AutoModel, folder)(**batch).last_hidden_state
        torch.testing.assert_close(hidden[:, 0], model.encoder(batch), atol=1e-5, rtol=0)
        torch.testing.assert_close(load_classifier(folder)[0].eval().predict(batch),
                                   model.predict(batch), atol=0, rtol=0)
    save_classifier(folder, TextClassifier(_encoder(tok), 3), tok)
    assert not (folder / "classifier_head.safetensors").is_file()


def test_classifier_whose_hf_head_is_not_linear_saves_the_encoder(tok, tmp_path: Path):
    """RoBERTa has a pooler (ours pools with it) but RobertaForSequenceClassification's head is
    dense + tanh + linear on <s>, not ours: the run's folder falls back to the encoder and our
    head beside it, and still loads exactly; the export with the head is refused."""
    from contrastive.eval.classifier_folder import load_classifier

    torch.manual_seed(0)
    config = transformers.RobertaConfig(vocab_size=tok.vocab_size, hidden_size=32,
                                        num_hidden_layers=1, num_attention_heads=2,
                                        intermediate_size=64, max_position_embeddings=80)
    model = TextClassifier(TextEncoder(transformers.RobertaModel(config)), 2).eval()
    assert model.encoder.pooling == "pooler"
    folder = save_classifier(tmp_path / "m", model, tok)
    assert json.loads((folder / "classifier.json").read_text())["layout"] == "encoder"
    batch = {k: v for k, v in tok(SENTENCES).items() if k != "token_type_ids"}
    with torch.no_grad():
        torch.testing.assert_close(load_classifier(folder)[0].eval().predict(batch),
                                   model.predict(batch), atol=0, rtol=0)
    with pytest.raises(ValueError, match="not the pooler \\+ linear"):
        export_classifier(model, tmp_path / "x", tok)
