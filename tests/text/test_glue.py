"""GLUE readers on small TSVs written in the official layouts, and the official metrics.

Layouts as the GLUE distribution has them (download_glue_data.py; the column names the
huggingface/datasets GLUE script and the transformers GLUE processors read).
"""

from __future__ import annotations

import csv
import logging
import math
from pathlib import Path

import numpy as np
import pytest

from contrastive.data.glue import GLUE_TASKS, GlueFormatError, glue_metrics, load_glue

# a sentence opening with an unbalanced double quote, as GLUE has them: with quoting on, a
# CSV reader takes the quote as the start of a quoted field and swallows the following rows
QUIRK = '"the film is , at heart , a good one'

MNLI_PARSES = "(a)\t(b)\t(( a ))\t(( b ))"


def _write(path: Path, lines: list[str], bom: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(("\ufeff" if bom else "") + "".join(line + "\n" for line in lines),
                    encoding="utf-8")


@pytest.fixture(scope="module")
def glue_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("glue_data")
    _write(root / "SST-2/train.tsv", ["sentence\tlabel", f"{QUIRK}\t1", "it 's dull\t0",
                                      "a \"quoted\" word\t1"])
    _write(root / "SST-2/dev.tsv", ["sentence\tlabel", "fine\t1"])
    _write(root / "SST-2/test.tsv", ["index\tsentence", "0\tunseen one", "1\tunseen two"])
    # CoLA train / dev: no header; source, label, original annotation (* if bad), sentence
    _write(root / "CoLA/train.tsv", ["gj04\t1\t\tOur friends won't buy this analysis.",
                                     "gj04\t0\t*\tOne more pseudo generalization and I'm giving up .",
                                     f"cj99\t1\t\t{QUIRK}"])
    _write(root / "CoLA/dev.tsv", ["gj04\t0\t*\tThe more books I ask to whom he will give."])
    _write(root / "CoLA/test.tsv", ["index\tsentence", "0\tBill whistled past the house."])
    # MRPC: the source files start with a UTF-8 byte-order mark
    _write(root / "MRPC/train.tsv", ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String",
                                     "1\t702876\t702977\tAmrozi accused his brother .\tHe accused his brother .",
                                     "0\t2108705\t2108831\tYucaipa owned Dominick 's .\tIt sold the chain ."],
           bom=True)
    _write(root / "MRPC/test.tsv", ["index\t#1 ID\t#2 ID\t#1 String\t#2 String",
                                    "0\t1089874\t1089925\tPCCW 's chief .\tCurrent Chief ."])
    qqp = ["id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate"]
    qqp += [f"{i}\t{2 * i}\t{2 * i + 1}\tq{i} one ?\tq{i} two ?\t{i % 2}" for i in range(150)]
    qqp.insert(42, "999\t1\t2\tbroken row without a second question")  # as in the QQP source
    _write(root / "QQP/train.tsv", qqp)
    _write(root / "QQP/test.tsv", ["id\tquestion1\tquestion2", "0\tWhy ?\tHow ?"])
    sts_head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
    _write(root / "STS-B/dev.tsv", [sts_head + "\tscore",
                                    "0\tmain-captions\tMSRvid\t2012test\t0000\tnone\tnone\tA man with a hard hat is dancing.\tA man wearing a hard hat is dancing.\t5.000",
                                    "1\tmain-captions\tMSRvid\t2012test\t0002\tnone\tnone\tA young child is riding a horse.\tA child is riding a horse.\t4.750"])
    _write(root / "STS-B/test.tsv", [sts_head, "0\tmain-captions\tMSRvid\t2012test\t0024\tnone\tnone\tA girl is styling her hair.\tA girl is brushing her hair."])
    mnli_head = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
                 "sentence1_parse\tsentence2_parse\tsentence1\tsentence2")
    _write(root / "MNLI/train.tsv", [mnli_head + "\tlabel1\tgold_label",
                                     f"0\t31193\t31193n\tgovernment\t{MNLI_PARSES}\tConceptually cream skimming has two dimensions .\tProduct and geography are what make cream skimming work .\tneutral\tneutral",
                                     f"1\t101457\t101457e\ttelephone\t{MNLI_PARSES}\tyou know during the season\tYou lose the things .\tentailment\tentailment"])
    dev_head = mnli_head + "\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label"
    _write(root / "MNLI/dev_matched.tsv", [dev_head,
                                           f"0\t63735\t63735n\tslate\t{MNLI_PARSES}\tThe new rights are nice enough\tEveryone really likes the newest benefits\tneutral\tentailment\tneutral\tneutral\tneutral\tneutral",
                                           f"1\t91383\t91383c\tgovernment\t{MNLI_PARSES}\tThis site includes a list\tThe Government Executive articles\tcontradiction\tcontradiction\tcontradiction\tcontradiction\tcontradiction\tcontradiction"])
    _write(root / "MNLI/dev_mismatched.tsv", [dev_head,
                                              f"0\t75290\t75290c\tletters\t{MNLI_PARSES}\tYour contribution helped\tYour contributions were of no help\tcontradiction\tcontradiction\tcontradiction\tcontradiction\tcontradiction\tcontradiction"])
    _write(root / "MNLI/test_matched.tsv", [mnli_head, f"0\t31493\t31493\ttravel\t{MNLI_PARSES}\tHierbas , ans seco\tThis is a drink .",])
    _write(root / "QNLI/dev.tsv", ["index\tquestion\tsentence\tlabel",
                                   "0\tWhat came into force ?\tThe law came into force .\tentailment",
                                   "1\tWhat is the name ?\tIt rained .\tnot_entailment"])
    _write(root / "RTE/dev.tsv", ["index\tsentence1\tsentence2\tlabel",
                                  f"0\tDana Reeve died .\t{QUIRK}\tnot_entailment",
                                  "1\tYet , we now are discovering .\tWe are discovering .\tentailment"])
    return root


def test_quoting_quirk_needs_quoting_disabled(glue_root: Path):
    with open(glue_root / "SST-2/train.tsv", encoding="utf-8", newline="") as f:
        default = list(csv.reader(f, delimiter="\t"))
    assert len(default) != 4  # a default reader merges rows: the layout test below can fail
    ds = load_glue("sst2", glue_root / "SST-2", "train")
    assert ds.text_a == [QUIRK, "it 's dull", 'a "quoted" word']
    assert ds.labels.tolist() == [1, 0, 1] and ds.text_b is None
    assert ds[0] == {"text_a": QUIRK, "label": 1}


def test_cola_train_dev_have_no_header(glue_root: Path):
    ds = load_glue("cola", glue_root, "train")  # the glue_data folder works too
    assert len(ds) == 3  # the first line is data, not a header
    assert ds.text_a[0] == "Our friends won't buy this analysis."
    assert ds.text_a[2] == QUIRK and ds.labels.tolist() == [1, 0, 1]
    assert load_glue("cola", glue_root, "dev").labels.tolist() == [0]
    test = load_glue("cola", glue_root, "test")  # the test file has a header
    assert test.text_a == ["Bill whistled past the house."] and test.labels.tolist() == [-1]
    assert not test.has_labels


def test_pair_tasks_columns_and_label_ids(glue_root: Path):
    mrpc = load_glue("mrpc", glue_root, "train")  # byte-order mark before "Quality"
    assert mrpc.text_a == ["Amrozi accused his brother .", "Yucaipa owned Dominick 's ."]
    assert mrpc.text_b == ["He accused his brother .", "It sold the chain ."]
    assert mrpc.labels.tolist() == [1, 0]
    assert load_glue("mrpc", glue_root, "test").text_b == ["Current Chief ."]
    sts = load_glue("STS-B", glue_root, "dev")
    assert sts.labels.dtype == np.float32 and sts.labels.tolist() == [5.0, 4.75]
    assert sts.text_b[1] == "A child is riding a horse." and sts.task.num_labels == 1
    sts_test = load_glue("stsb", glue_root, "test")
    assert math.isnan(sts_test.labels[0]) and sts_test.text_a == ["A girl is styling her hair."]
    mnli = load_glue("mnli", glue_root, "train")
    assert mnli.text_a[0] == "Conceptually cream skimming has two dimensions ."
    assert mnli.labels.tolist() == [1, 0]  # entailment 0, neutral 1, contradiction 2
    dev_m = load_glue("mnli", glue_root, "dev_matched")  # gold_label is the last of 16 columns
    assert dev_m.labels.tolist() == [1, 2] and dev_m.text_b[1] == "The Government Executive articles"
    assert load_glue("mnli", glue_root, "dev").labels.tolist() == [1, 2]  # dev = matched
    assert load_glue("mnli", glue_root, "dev_mismatched").labels.tolist() == [2]
    assert load_glue("mnli", glue_root, "test_matched").labels.tolist() == [-1]
    qnli = load_glue("qnli", glue_root, "dev")
    assert qnli.text_a[0] == "What came into force ?" and qnli.labels.tolist() == [0, 1]
    rte = load_glue("rte", glue_root, "dev")
    assert rte.text_b[0] == QUIRK and rte.labels.tolist() == [1, 0]
    assert load_glue("qqp", glue_root, "test").text_b == ["How ?"]
    assert set(GLUE_TASKS) == {"cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte"}


def test_malformed_rows_skipped_below_one_percent(glue_root: Path, caplog):
    with caplog.at_level(logging.WARNING, logger="contrastive.data.glue"):
        qqp = load_glue("qqp", glue_root, "train")
    assert len(qqp) == 150 and qqp.text_a[0] == "q0 one ?" and qqp.labels[:4].tolist() == [0, 1, 0, 1]
    assert "skipped 1 malformed rows of 151" in caplog.text and "lines 43" in caplog.text


def test_wrong_layouts_fail_with_the_expected_one(tmp_path: Path, glue_root: Path):
    # an SST-2 file given as QNLI: no 'question' column
    (tmp_path / "QNLI").mkdir()
    (tmp_path / "QNLI/train.tsv").write_bytes((glue_root / "SST-2/train.tsv").read_bytes())
    with pytest.raises(GlueFormatError, match="no column 'question'"):
        load_glue("qnli", tmp_path, "train")
    # CoLA re-saved with a header and two columns: not the official layout
    _write(tmp_path / "CoLA/train.tsv", ["sentence\tlabel", "a b c\t1", "d e f\t0"])
    with pytest.raises(GlueFormatError, match="3 of 3 rows are malformed.*4 fields without a header"):
        load_glue("cola", tmp_path, "train")
    # labels outside the task's set
    _write(tmp_path / "RTE/train.tsv", ["index\tsentence1\tsentence2\tlabel", "0\ta\tb\tyes"])
    with pytest.raises(GlueFormatError, match="entailment"):
        load_glue("rte", tmp_path, "train")
    with pytest.raises(FileNotFoundError, match="glue_data/SST-2"):
        load_glue("sst2", tmp_path, "train")
    with pytest.raises(ValueError, match="unknown GLUE task"):
        load_glue("wnli2", tmp_path)
    with pytest.raises(ValueError, match="unknown split"):
        load_glue("sst2", glue_root, "validation")


# ---- metrics: against the formulas, in float64 ------------------------------------------

GOLD = np.array([1, 1, 0, 1, 0, 0, 1, 1, 0, 1])
PRED = np.array([1, 0, 0, 1, 1, 0, 1, 1, 0, 0])
# confusion: tp=4, fn=2, fp=1, tn=3
TP, FN, FP, TN = 4, 2, 1, 3


def test_accuracy_f1_mcc_match_their_formulas():
    acc = (TP + TN) / 10
    precision, recall = TP / (TP + FP), TP / (TP + FN)
    f1 = 2 * precision * recall / (precision + recall)
    mcc = (TP * TN - FP * FN) / math.sqrt((TP + FP) * (TP + FN) * (TN + FP) * (TN + FN))
    assert glue_metrics("sst2", PRED, GOLD) == pytest.approx({"accuracy": acc, "score": acc}, abs=1e-12)
    m = glue_metrics("mrpc", PRED, GOLD)
    assert m == pytest.approx({"accuracy": acc, "f1": f1, "score": (acc + f1) / 2}, abs=1e-12)
    assert glue_metrics("qqp", PRED, GOLD)["f1"] == pytest.approx(f1, abs=1e-12)
    assert glue_metrics("cola", PRED, GOLD) == pytest.approx({"mcc": mcc, "score": mcc}, abs=1e-12)
    # logits: arg-max per row
    logits = np.stack([-PRED.astype(float), PRED.astype(float)], axis=1)
    assert glue_metrics("rte", logits, GOLD)["accuracy"] == pytest.approx(acc, abs=1e-12)
    three = np.array([[0.1, 2.0, 0.3], [3.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    assert glue_metrics("mnli", three, [1, 0, 1])["accuracy"] == pytest.approx(2 / 3, abs=1e-12)


def test_pearson_spearman_match_their_formulas():
    gold = np.array([0.0, 1.2, 2.5, 3.1, 4.0, 5.0])
    pred = np.array([0.3, 0.9, 3.0, 2.8, 4.4, 4.1])
    d = lambda v: v - v.mean()  # noqa: E731
    pearson = (d(pred) @ d(gold)) / math.sqrt((d(pred) @ d(pred)) * (d(gold) @ d(gold)))
    rp, rg = pred.argsort().argsort().astype(float), gold.argsort().argsort().astype(float)
    spearman = (d(rp) @ d(rg)) / math.sqrt((d(rp) @ d(rp)) * (d(rg) @ d(rg)))
    m = glue_metrics("stsb", pred[:, None], gold)  # (N, 1) regression output accepted
    assert m == pytest.approx({"pearson": pearson, "spearman": spearman,
                               "score": (pearson + spearman) / 2}, abs=1e-12)
    assert spearman != pytest.approx(pearson)  # the two are really different numbers here


def test_metrics_refuse_unlabelled_or_mismatched_input():
    with pytest.raises(ValueError, match="unlabelled"):
        glue_metrics("sst2", [1, 0], [-1, -1])
    with pytest.raises(ValueError, match="NaN"):
        glue_metrics("stsb", [1.0, 2.0], [np.nan, 1.0])
    with pytest.raises(ValueError, match="must be N >= 1"):
        glue_metrics("sst2", [1, 0, 1], [1, 0])


def test_stratified_indices_keep_each_class_share_and_are_seeded() -> None:
    from contrastive.data.glue import stratified_indices

    labels = np.array([0] * 70 + [1] * 20 + [2] * 10)
    idx = stratified_indices(labels, 30, seed=3)
    assert len(idx) == len(set(idx.tolist())) == 30 and (np.diff(idx) > 0).all()
    assert np.bincount(labels[idx]).tolist() == [21, 6, 3]  # 70 / 20 / 10 % of 30
    assert (stratified_indices(labels, 30, seed=3) == idx).all()
    assert not (stratified_indices(labels, 30, seed=4) == idx).all()
    # largest remainder: 7 of (5, 3, 2) -> exact 3.5, 2.1, 1.4 -> 4, 2, 1
    assert np.bincount(np.array([0] * 5 + [1] * 3 + [2] * 2)[stratified_indices(
        np.array([0] * 5 + [1] * 3 + [2] * 2), 7)]).tolist() == [4, 2, 1]
    scores = np.linspace(0, 5, 50)
    assert len(stratified_indices(scores, 10, regression=True)) == 10
    with pytest.raises(ValueError, match="n must be"):
        stratified_indices(labels, 101)


def test_split_off_holds_out_a_disjoint_stratified_part(glue_root: Path) -> None:
    train = load_glue("mrpc", glue_root / "MRPC", "train")
    rest, held = train.split_off(2, seed=0)
    assert len(rest) + len(held) == len(train) and held.split == "train_held_out"
    pairs = set(zip(train.text_a, train.text_b))
    assert set(zip(rest.text_a, rest.text_b)) | set(zip(held.text_a, held.text_b)) == pairs
    assert not set(zip(rest.text_a, rest.text_b)) & set(zip(held.text_a, held.text_b))


def test_majority_floor_on_the_real_mrpc_dev_set(shared_data: Path) -> None:
    """The floor of the issue-30 table against counts read from the file itself."""
    import importlib.util
    import sys

    glue = shared_data / "glue"
    if not (glue / "MRPC" / "dev.tsv").is_file():
        pytest.skip(f"the real GLUE files are not in {glue} (see ../shared/data/README.md)")
    spec = importlib.util.spec_from_file_location(
        "glue_floors", Path(__file__).resolve().parents[2] / "benchmarks" / "glue_floors.py")
    assert spec is not None and spec.loader is not None
    floors = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = floors
    spec.loader.exec_module(floors)
    train, held, dev = floors.task_splits("mrpc", glue)
    rows = [line.split("\t") for line in (glue / "MRPC" / "dev.tsv").read_text(
        encoding="utf-8-sig").splitlines()[1:] if line]
    positives = sum(r[0] == "1" for r in rows)
    assert len(dev) == len(rows) == 408 and len(held) == round(0.1 * (len(train) + len(held)))
    m = floors.majority(train, dev)  # "equivalent" is the majority of MRPC's training pairs
    assert m["accuracy"] == pytest.approx(positives / len(rows))
    assert m["f1"] == pytest.approx(2 * positives / (2 * positives + (len(rows) - positives)))
