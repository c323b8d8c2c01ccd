"""One spelling of a BERT's sizes in every text and image-text recipe, and one builder behind it
(issue 48: the sizes were spelt three ways and 'bert or hf:FOLDER' was checked in three places)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from contrastive.engine import dual_encoder_kwargs, parse_config
from contrastive.nn.text_encoders import bert_options, hf_folder, text_encoder

SIZES = ["--layers", "1", "--hidden", "16", "--heads", "2", "--intermediate-size", "24",
         "--dropout", "0.25"]
EXPECTED = dict(layers=1, hidden=16, heads=2, intermediate_size=24, dropout=0.25)
CONFIGS = {"simcse": ("SimCSEConfig", []), "bert_finetune": ("FinetuneConfig", []),
           "lrc_bert": ("LRCBertConfig", ["--teacher", "T"]), "clip": ("ClipConfig", []),
           "siglip": ("SigLIPConfig", [])}


def _config(rx, name: str, argv: list[str]):
    cls_name, extra = CONFIGS[name]
    return parse_config(getattr(rx.load_recipe(name), cls_name), [*extra, *argv])


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_text_recipe_spells_the_sizes_alike(rx, name):
    assert _config(rx, name, SIZES).bert_sizes() == EXPECTED


def test_the_recipes_hand_the_sizes_to_the_one_builder(rx):
    """What each recipe builds from the same flags: the same BERT configuration."""
    wanted = bert_options(**EXPECTED, vocab_size=50)
    simcse = rx.load_recipe("simcse")
    kwargs = simcse.method_kwargs(_config(rx, "simcse", SIZES), 50)["encoder_kwargs"]
    assert kwargs == wanted
    tokenizer = SimpleNamespace(vocab_size=50, max_length=512)
    towers = dual_encoder_kwargs(_config(rx, "clip", SIZES), tokenizer)["text_kwargs"]
    assert towers == {**wanted, "pooling": "mean"}
    finetune = _config(rx, "bert_finetune", SIZES)
    encoder = text_encoder(finetune.model, vocab_size=50, **finetune.bert_sizes())
    config = encoder.config
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
            config.intermediate_size, config.hidden_dropout_prob,
            config.attention_probs_dropout_prob) == (1, 16, 2, 24, 0.25, 0.25)


def test_a_text_model_is_bert_or_an_hf_folder(rx, capsys):
    assert hf_folder("bert") is None and hf_folder("hf:/models/x") == "/models/x"
    for bad in ("small_cnn", "hf:", "BERT"):
        with pytest.raises(ValueError, match="'bert' or 'hf:FOLDER'"):
            hf_folder(bad)
    for name, flag in (("simcse", "--encoder"), ("lrc_bert", "--student"),
                       ("clip", "--text-encoder"), ("siglip", "--text-encoder")):
        with pytest.raises(SystemExit):  # one line naming both forms, exit status 2
            _config(rx, name, [flag, "small_cnn"])
        assert "'bert' or 'hf:FOLDER'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--keep-layers applies to an hf:FOLDER model"):
        text_encoder("bert", keep_layers="0", vocab_size=50, **EXPECTED)


def test_the_old_flags_of_the_recipes_still_work(rx):
    """Until the long LRC-BERT runs are done: --intermediate is lrc_bert's loss or simcse's
    width by its value, --text-* the dual encoder's sizes, each with a notice."""
    with pytest.warns(FutureWarning, match="--intermediate is renamed --layer-loss"):
        assert _config(rx, "lrc_bert", ["--intermediate", "mse"]).layer_loss == "mse"
    with pytest.warns(FutureWarning, match="--intermediate is renamed --intermediate-size"):
        assert _config(rx, "simcse", ["--intermediate", "32"]).intermediate_size == 32
    with pytest.warns(FutureWarning, match="--text-layers is renamed --layers"):
        assert _config(rx, "clip", ["--text-layers", "3"]).layers == 3
