"""Text encoders: shapes, masks, pooling, perturbation hook, and safe offline loading."""

from __future__ import annotations

import builtins
import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from contrastive.nn import create_encoder, stage_features  # noqa: E402
from contrastive.nn.text_encoders import (  # noqa: E402
    TextEncoder,
    TextEncoderOutput,
    UnsafeCheckpointError,
)

TINY = dict(num_layers=2, hidden_size=32, num_heads=2, intermediate_size=64, vocab_size=50,
            max_position_embeddings=32)


def _tiny(**kw) -> TextEncoder:
    torch.manual_seed(0)
    enc = create_encoder("bert", **{**TINY, **kw})
    return enc.eval()


def _batch(b: int = 3, t: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 50, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.long)
    mask[0, 4:] = 0
    ids[0, 4:] = 0
    return ids, mask


def test_bert_from_sizes_outputs_and_shapes():
    enc = _tiny()
    assert isinstance(enc, TextEncoder)
    assert enc.num_features == enc.hidden_size == 32 and enc.num_layers == 2
    assert enc.config.num_attention_heads == 2 and enc.config.intermediate_size == 64
    ids, mask = _batch()
    out = enc.encode(ids, mask)
    assert isinstance(out, TextEncoderOutput)
    assert len(out.hidden_states) == 2
    assert all(h.shape == (3, 7, 32) for h in out.hidden_states)
    assert out.embeddings.shape == (3, 7, 32) and out.pooled.shape == (3, 32)
    assert torch.equal(out.attention_mask, mask)
    # the embedding-layer output is the embeddings module's output, and it is not a layer
    with torch.no_grad():
        emb = enc.model.embeddings(input_ids=ids)
    torch.testing.assert_close(out.embeddings, emb)
    assert not torch.allclose(out.hidden_states[0], emb)
    # forward: pooled features, from tensors or from a batch dict
    torch.testing.assert_close(enc(ids, mask), out.pooled)
    torch.testing.assert_close(enc({"input_ids": ids, "attention_mask": mask}), out.pooled)
    # stage_features (the distiller's entry point) gets the per-layer outputs
    stages = stage_features(enc, ids)
    assert len(stages) == 2 and stages[-1].shape == (3, 7, 32)


def test_pooling_modes_and_padding_is_masked():
    ids, mask = _batch()
    enc = _tiny(pooling="mean")
    out = enc.encode(ids, mask)
    last = out.hidden_states[-1].double()
    m = mask.double().unsqueeze(-1)
    torch.testing.assert_close(out.pooled.double(), (last * m).sum(1) / m.sum(1))
    # a padded sequence gives the same hidden states on its real tokens and the same mean
    # as the same sequence alone (float32 attention: ~1e-6 relative differences)
    alone = enc.encode(ids[:1, :4], mask[:1, :4])
    torch.testing.assert_close(alone.hidden_states[-1][0], out.hidden_states[-1][0, :4],
                               rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(alone.pooled[0], out.pooled[0], rtol=1e-4, atol=1e-5)
    cls = _tiny(pooling="cls").encode(ids, mask)
    torch.testing.assert_close(cls.pooled, cls.hidden_states[-1][:, 0])
    auto = _tiny().encode(ids, mask)  # BERT has a pooler: tanh(W h_cls + b)
    pooler = enc.model.pooler  # same seed, same weights
    torch.testing.assert_close(auto.pooled, pooler(auto.hidden_states[-1]))
    with pytest.raises(ValueError, match="pooling"):
        _tiny(pooling="max")


def test_embedding_delta_perturbs_the_input_of_layer_one():
    enc = _tiny()
    ids, mask = _batch()
    base = enc.encode(ids, mask)
    zero = enc.encode(ids, mask, embedding_delta=torch.zeros(3, 7, 32))
    torch.testing.assert_close(zero.pooled, base.pooled)
    delta = torch.randn(3, 7, 32, generator=torch.Generator().manual_seed(2))
    moved = enc.encode(ids, mask, embedding_delta=delta)
    torch.testing.assert_close(moved.embeddings, base.embeddings + delta)
    assert not torch.allclose(moved.hidden_states[0], base.hidden_states[0], atol=1e-3)
    # the hook is removed after the pass
    torch.testing.assert_close(enc.encode(ids, mask).pooled, base.pooled)
    # d loss / d embeddings is available (LRC-BERT's gradient perturbation)
    out = enc.encode(ids, mask)
    (g,) = torch.autograd.grad(out.pooled.square().sum(), out.embeddings)
    assert g.shape == (3, 7, 32) and g.abs().sum() > 0
    with pytest.raises(ValueError, match="embedding_delta"):
        enc.encode(ids, mask, embedding_delta=torch.zeros(3, 6, 32))


def test_bad_sizes_and_pretrained_flag():
    with pytest.raises(ValueError, match="multiple of num_heads"):
        create_encoder("bert", num_layers=2, hidden_size=30, num_heads=4)
    with pytest.raises(ValueError, match="num_layers"):
        create_encoder("bert", num_layers=0)
    with pytest.raises(ValueError, match="hf:<folder>"):
        create_encoder("bert", pretrained=True)
    with pytest.raises(ValueError, match="batch, tokens"):
        _tiny().encode(torch.zeros(7, dtype=torch.long))


def _state(enc: TextEncoder) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in enc.model.state_dict().items()}


def test_local_folder_safetensors_roundtrip(tmp_path: Path):
    enc = _tiny()
    enc.model.save_pretrained(tmp_path / "ckpt")  # config.json + model.safetensors
    assert (tmp_path / "ckpt" / "model.safetensors").is_file()
    loaded = create_encoder(f"hf:{tmp_path / 'ckpt'}").eval()
    assert isinstance(loaded, TextEncoder) and loaded.num_features == 32
    for k, v in _state(enc).items():
        torch.testing.assert_close(loaded.model.state_dict()[k], v, rtol=0, atol=0)
    ids, mask = _batch()
    torch.testing.assert_close(loaded(ids, mask), enc(ids, mask))
    # a config without weights: random weights with that architecture, through 'bert'
    fresh = create_encoder("bert", config=tmp_path / "ckpt")
    assert fresh.num_layers == 2 and fresh.num_features == 32
    assert not torch.allclose(fresh.model.embeddings.word_embeddings.weight,
                              enc.model.embeddings.word_embeddings.weight)


def test_task_checkpoint_loads_as_its_encoder(tmp_path: Path):
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=32, num_labels=3)
    clf = transformers.BertForSequenceClassification(cfg)
    clf.save_pretrained(tmp_path / "task")
    loaded = create_encoder(f"hf:{tmp_path / 'task'}")
    torch.testing.assert_close(loaded.model.encoder.layer[1].output.dense.weight,
                               clf.bert.encoder.layer[1].output.dense.weight, rtol=0, atol=0)


def test_pickle_bin_is_read_with_weights_only(tmp_path: Path):
    enc = _tiny()
    folder = tmp_path / "bin"
    enc.model.config.save_pretrained(folder)
    torch.save(enc.model.state_dict(), folder / "pytorch_model.bin")  # plain tensors: allowed
    loaded = create_encoder(f"hf:{folder}")
    torch.testing.assert_close(loaded.model.embeddings.word_embeddings.weight,
                               enc.model.embeddings.word_embeddings.weight, rtol=0, atol=0)


class _Payload:
    """Unpickling this calls open(marker, "w"): a file appears if the pickle's code runs."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (builtins.open, (self.marker, "w"))


def test_malicious_pytorch_model_bin_does_not_run(tmp_path: Path):
    folder = tmp_path / "evil"
    _tiny().model.config.save_pretrained(folder)
    marker = tmp_path / "pwned"
    torch.save({"embeddings.word_embeddings.weight": _Payload(marker)}, folder / "pytorch_model.bin")
    # the payload is live: an unrestricted unpickler runs it
    control = tmp_path / "control"
    torch.save({"x": _Payload(control)}, tmp_path / "control.bin")
    torch.load(tmp_path / "control.bin", weights_only=False)
    assert control.exists()
    with pytest.raises(UnsafeCheckpointError, match="pytorch_model.bin.*refused"):
        create_encoder(f"hf:{folder}")
    assert not marker.exists()
    # next to a model.safetensors, the pickle is not even opened
    enc = _tiny()
    enc.model.save_pretrained(folder)
    torch.save({"x": _Payload(marker)}, folder / "pytorch_model.bin")
    loaded = create_encoder(f"hf:{folder}")
    torch.testing.assert_close(loaded.model.pooler.dense.weight, enc.model.pooler.dense.weight,
                               rtol=0, atol=0)
    assert not marker.exists()


def test_remote_code_is_never_run(tmp_path: Path):
    folder = tmp_path / "remote"
    folder.mkdir()
    marker = tmp_path / "remote_code_ran"
    (folder / "evil.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        "from transformers import PretrainedConfig\n"
        "class EvilConfig(PretrainedConfig):\n    model_type = 'evil_model'\n"
    )
    (folder / "config.json").write_text(json.dumps({
        "model_type": "evil_model",
        "auto_map": {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"},
    }))
    torch.save({}, folder / "pytorch_model.bin")
    with pytest.raises(ValueError, match="trust_remote_code=False"):
        create_encoder(f"hf:{folder}")
    assert not marker.exists()


def test_missing_folder_or_weights_fail_clearly(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="nothing is downloaded"):
        create_encoder("hf:bert-base-uncased-not-here")
    (tmp_path / "cfg").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        create_encoder(f"hf:{tmp_path / 'cfg'}")
    _tiny().model.config.save_pretrained(tmp_path / "cfg")
    with pytest.raises(FileNotFoundError, match="no weights.*config="):
        create_encoder(f"hf:{tmp_path / 'cfg'}")


def test_text_encoder_trains():
    enc = _tiny().train()
    ids, mask = _batch()
    y = enc(ids, mask)
    assert y.shape == (3, enc.num_features)
    y.square().mean().backward()
    grads = {n: p.grad for n, p in enc.named_parameters() if p.requires_grad}
    assert grads and all(g is not None for g in grads.values())
    assert all(g.abs().sum() > 0 for n, g in grads.items() if "layer.1." in n or "pooler" in n)


def test_encoder_from_layers_copies_the_chosen_layers_exactly() -> None:
    """DistilBERT-style initialisation: layers (1, 3) of a 4-layer encoder, weights copied."""
    pytest.importorskip("transformers")
    from contrastive.nn.text_encoders import build_text_encoder, encoder_from_layers

    torch.manual_seed(0)
    big = build_text_encoder(num_layers=4, hidden_size=16, num_heads=2, vocab_size=50,
                             dropout=0.0, attention_dropout=0.0).eval()
    small = encoder_from_layers(big, [1, 3]).eval()
    assert small.num_layers == 2 and big.num_layers == 4 and small.pooling == big.pooling
    for new, old in ((0, 1), (1, 3)):
        a, b = small.model.encoder.layer[new].state_dict(), big.model.encoder.layer[old].state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ids = torch.randint(0, 50, (3, 7))
    with torch.no_grad():  # the copy = embeddings -> big layer 1 -> big layer 3 (no padding)
        got = small.encode(ids, torch.ones_like(ids)).hidden_states
        h = big.model.embeddings(input_ids=ids)
        for new, old in ((0, 1), (1, 3)):
            out = big.model.encoder.layer[old](h)
            h = out[0] if isinstance(out, tuple) else out
            torch.testing.assert_close(got[new], h)
    with pytest.raises(ValueError, match="layers must be"):
        encoder_from_layers(big, [4])
