"""WordPiece tokenizer: trained offline and reproducibly, saved / loaded as JSON, BERT vocab.txt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("tokenizers")

from contrastive.data.generated_text import generate_sentiment, text_corpus  # noqa: E402
from contrastive.data.tokenizer import SPECIAL_TOKENS, load_tokenizer, train_wordpiece  # noqa: E402


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return list(text_corpus(300, seed=0))


def test_training_is_reproducible_and_covers_the_corpus(corpus):
    tok = train_wordpiece(corpus, vocab_size=400)
    again = train_wordpiece(corpus, vocab_size=400)
    assert tok.tokenizer.get_vocab() == again.tokenizer.get_vocab()
    vocab = tok.tokenizer.get_vocab()
    assert [vocab[t] for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    batch = tok(corpus[:200])
    assert not (batch["input_ids"] == tok.unk_id).any()  # every piece of the corpus is known
    # the task's words become single tokens once the vocabulary is large enough
    assert tok.tokenizer.encode("the soundtrack was never hilarious").tokens == [
        "[CLS]", "the", "soundtrack", "was", "never", "hilarious", "[SEP]"]
    small = train_wordpiece(corpus, vocab_size=120)
    assert small.vocab_size == 120
    pieces = small.tokenizer.encode("hilarious").tokens[1:-1]
    assert len(pieces) > 1 and all(p.startswith("##") for p in pieces[1:])
    assert small.decode(small(["the film was hilarious"])["input_ids"][0]) == "the film was hilarious"


def test_batches_pairs_padding_truncation(corpus):
    tok = train_wordpiece(corpus, vocab_size=400, max_length=8)
    b = tok(["the film was great", "the movie was not very dull at all"], ["the plot was dull", "x"])
    assert set(b) == {"input_ids", "attention_mask", "token_type_ids"}
    assert all(v.dtype == torch.long and v.shape == (2, 8) for v in b.values())
    ids, types, mask = b["input_ids"][0], b["token_type_ids"][0], b["attention_mask"][0]
    assert ids[0] == tok.cls_id and (ids == tok.sep_id).sum() == 2
    # truncated to 8 tokens, both segments kept: [CLS] a.. [SEP] b.. [SEP], types 0.. then 1..
    assert ids[-1] == tok.sep_id and mask.tolist() == [1] * 8
    assert types.tolist() == sorted(types.tolist()) and types[0] == 0 and types.sum() >= 2
    single = tok(["the film", "the film was great"])
    assert single["attention_mask"][0].tolist() == [1, 1, 1, 1, 0, 0]
    assert single["input_ids"][0, 4:].tolist() == [tok.pad_id] * 2
    ds = generate_sentiment(4, seed=0)
    collated = tok.collate([ds[i] for i in range(4)])
    assert collated["labels"].tolist() == ds.labels.tolist() and collated["input_ids"].shape[0] == 4
    float_labels = tok.collate([{"text_a": "a", "text_b": "b", "label": 4.5}])
    assert float_labels["labels"].dtype == torch.float32
    with pytest.raises(ValueError, match="second texts"):
        tok(["a", "b"], ["c"])


def test_save_and_load_roundtrip(tmp_path: Path, corpus):
    tok = train_wordpiece(corpus, vocab_size=300)
    path = tok.save(tmp_path / "tok")
    json.loads(path.read_text())  # plain JSON
    loaded = load_tokenizer(tmp_path / "tok")
    for key, value in tok(corpus[:50], corpus[50:100]).items():
        assert torch.equal(loaded(corpus[:50], corpus[50:100])[key], value)
    with pytest.raises(FileNotFoundError, match="vocab.txt"):
        load_tokenizer(tmp_path)


def test_bert_vocab_txt_folder(tmp_path: Path):
    vocab = [*SPECIAL_TOKENS, "the", "un", "##aff", "##able", "man", ",", "##s"]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tok = load_tokenizer(tmp_path)
    enc = tok.tokenizer.encode("The unaffable MAN, men")
    assert enc.tokens == ["[CLS]", "the", "un", "##aff", "##able", "man", ",", "[UNK]", "[SEP]"]
    assert enc.ids == [2, 5, 6, 7, 8, 9, 10, 1, 3]  # ids are line numbers
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    assert load_tokenizer(tmp_path).tokenizer.encode("The").tokens[1] == "[UNK]"
