"""Text batches (contrastive.data.text_batches), SimCSE's file layouts, and STS evaluation
(contrastive.eval.sts + the contrastive-sts-eval command)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from contrastive.data.generated_text import generate_nli
from contrastive.data.text_batches import (
    GroupCollate,
    SentenceGroups,
    nli_groups,
    read_sentence_file,
    read_simcse_csv,
)
from contrastive.eval.sts import sts_correlation


def test_simcse_csv_triples_pairs_tsv_and_quoting(tmp_path: Path):
    # nli_for_simcse.csv: header sent0,sent1,hard_neg; commas inside quoted fields
    p = tmp_path / "nli_for_simcse.csv"
    p.write_text('sent0,sent1,hard_neg\n"A man, tall, walks.",A man walks.,Nobody walks.\n'
                 'Two dogs run.,Dogs run.,"The dogs sleep, quietly."\n', encoding="utf-8")
    d = read_simcse_csv(p)
    assert d.size == 3 and d.names == ("sent0", "sent1", "hard_neg") and len(d) == 2
    assert d[0] == {"sentences": ("A man, tall, walks.", "A man walks.", "Nobody walks.")}
    assert d[1]["sentences"][2] == "The dogs sleep, quietly."
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("a\tb\nx, y\tz\n", encoding="utf-8")
    assert read_simcse_csv(pairs)[0] == {"sentences": ("x, y", "z")}


def test_simcse_files_bad_layouts_fail_naming_the_row(tmp_path: Path):
    p = tmp_path / "bad.csv"
    p.write_text("sent0,sent1,hard_neg\na,b,c\nd,e\n", encoding="utf-8")
    with pytest.raises(ValueError, match="row 3: expected 3 non-empty fields"):
        read_simcse_csv(p)
    p.write_text("sent0,sent1,hard_neg\na,,c\n", encoding="utf-8")
    with pytest.raises(ValueError, match="row 2"):
        read_simcse_csv(p)
    p.write_text("a,b,c,d\n1,2,3,4\n", encoding="utf-8")
    with pytest.raises(ValueError, match="has 4 columns"):
        read_simcse_csv(p)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no sentences"):
        read_sentence_file(empty)
    with pytest.raises(ValueError, match="same number"):
        SentenceGroups([("a", "b"), ("c",)])


def test_sentence_file_one_a_line(tmp_path: Path):
    p = tmp_path / "wiki1m_for_simcse.txt"
    p.write_text("\ufeffFirst sentence.\n\n  Second one, with a comma.  \n", encoding="utf-8")
    d = read_sentence_file(p)
    assert d.size == 1 and [g[0] for g in d.groups] == ["First sentence.", "Second one, with a comma."]


def test_group_collate_shapes_and_order():
    pytest.importorskip("tokenizers")
    from contrastive.data.tokenizer import train_wordpiece

    nli = generate_nli(6, seed=0)
    tok = train_wordpiece([s for trio in zip(nli.premise, nli.entailment, nli.contradiction)
                           for s in trio], vocab_size=200)
    groups = nli_groups(nli)
    assert groups[2]["sentences"] == (nli.premise[2], nli.entailment[2], nli.contradiction[2])
    assert nli_groups(nli, hard_negatives=False).size == 2
    batch = GroupCollate(tok)([groups[i] for i in range(4)])
    b, s, t = batch["input_ids"].shape
    assert (b, s) == (4, 3) and set(batch) == {"input_ids", "attention_mask", "token_type_ids"}
    assert all(v.shape == (b, s, t) and v.dtype == torch.long for v in batch.values())
    for i in range(4):  # example-major: [i, j] is sentence j of example i
        for j in range(3):
            alone = tok([groups[i]["sentences"][j]])["input_ids"][0]
            n = int(batch["attention_mask"][i, j].sum())
            assert n == len(alone) and torch.equal(batch["input_ids"][i, j, :n], alone)
            assert (batch["input_ids"][i, j, n:] == tok.pad_id).all()
    with pytest.raises(ValueError, match="different sentence counts"):
        GroupCollate(tok)([{"sentences": ("a", "b")}, {"sentences": ("a",)}])


def test_sts_correlation_is_spearman_of_cosines():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(50, 6, generator=g, dtype=torch.float64)
    b = torch.randn(50, 6, generator=g, dtype=torch.float64)
    gold = np.random.default_rng(0).uniform(0, 5, 50)
    cos = torch.nn.functional.cosine_similarity(a, b).numpy()
    r = sts_correlation(a, b, gold)
    assert r["spearman"] == pytest.approx(stats.spearmanr(cos, gold)[0], abs=1e-12)
    assert r["pearson"] == pytest.approx(stats.pearsonr(cos, gold)[0], abs=1e-12)
    # scale-free: scaling an embedding does not change a cosine
    assert sts_correlation(3 * a, b, gold)["spearman"] == pytest.approx(r["spearman"], abs=1e-12)
    # gold = a monotone function of the cosine: perfect rank correlation, imperfect Pearson
    perfect = sts_correlation(a, b, np.exp(4 * cos))
    assert perfect["spearman"] == pytest.approx(1.0) and perfect["pearson"] < 0.99
    with pytest.raises(ValueError, match="NaN"):
        sts_correlation(a, b, np.full(50, np.nan))
    with pytest.raises(ValueError, match=r"\(N, D\)"):
        sts_correlation(a, b[:3], gold)


def test_sts_command_on_a_glue_stsb_tsv(tmp_path: Path, capsys):
    """contrastive-sts-eval on a folder exported as recipes/simcse.py does, on an STS-B dev TSV
    in the official layout: the figure equals evaluate_sts with the same model."""
    pytest.importorskip("transformers")
    from contrastive.data.tokenizer import load_tokenizer, train_wordpiece
    from contrastive.eval.sts import evaluate_sts, main
    from contrastive.nn.text_encoders import build_text_encoder, load_text_encoder

    head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
    sents = ["the film was great", "the movie was excellent", "the plot was dull",
             "the music was never funny", "the ending was very moving", "the script was ugly"]
    rows = [f"{i}\tmain-captions\tMSRvid\t2012test\t{i:04d}\tnone\tnone\t{a}\t{b}\t{s:.3f}"
            for i, (a, b, s) in enumerate(zip(sents, sents[1:] + sents[:1], [5, 1, 0.5, 2, 3, 4]))]
    (tmp_path / "STS-B").mkdir()
    (tmp_path / "STS-B" / "dev.tsv").write_text("\n".join([head, *rows]) + "\n", encoding="utf-8")
    folder = tmp_path / "model"
    torch.manual_seed(0)
    enc = build_text_encoder(num_layers=1, hidden_size=16, num_heads=2, vocab_size=120,
                             pooling="cls")
    enc.model.save_pretrained(folder, safe_serialization=True)
    train_wordpiece(sents, vocab_size=120).save(folder)
    (folder / "simcse.json").write_text(json.dumps({"pooling": "mean"}), encoding="utf-8")
    assert main(["--model", str(folder), "--data", str(tmp_path / "STS-B")]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["pooling"] == "mean" and line["n"] == 6  # simcse.json's pooling was used
    want = evaluate_sts(load_text_encoder(folder, pooling="mean"), load_tokenizer(folder),
                        [r.split("\t")[7] for r in rows], [r.split("\t")[8] for r in rows],
                        [5, 1, 0.5, 2, 3, 4])
    assert line["spearman"] == pytest.approx(want["spearman"], abs=1e-12)
    assert main(["--model", str(folder), "--data", str(tmp_path / "STS-B" / "dev.tsv"),
                 "--pooling", "cls"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["pooling"] == "cls"
