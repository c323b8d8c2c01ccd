"""Config dataclass <-> command line."""

from __future__ import annotations

import dataclasses
import json

import pytest

from contrastive.engine.config import (
    TrainConfig,
    config_from_dict,
    config_to_dict,
    help_field,
    parse_config,
)


@dataclasses.dataclass
class _Recipe(TrainConfig):
    """A test recipe."""

    data: str = "shapes"
    queue_size: int = help_field(4096, "number of negative keys")
    symmetric: bool = help_field(False, "symmetric loss")
    temperature: float = help_field(0.2, "softmax temperature")


def test_every_field_is_a_flag_with_dashes_and_underscores():
    cfg = parse_config(_Recipe, ["--queue-size", "128", "--queue_size", "256", "--symmetric",
                                 "--lr", "0.5", "--lr-milestones", "3", "4", "--betas", "0.8",
                                 "0.9", "--progress", "false"])
    assert cfg.queue_size == 256 and cfg.symmetric is True and cfg.lr == 0.5
    assert cfg.lr_milestones == (3, 4) and cfg.betas == (0.8, 0.9) and cfg.progress is False
    assert parse_config(_Recipe, ["--no-symmetric"]).symmetric is False
    assert parse_config(_Recipe, []) == _Recipe()


def test_help_lists_fields_with_defaults(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_config(_Recipe, ["--help"], prog="recipe.py")
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "--queue-size" in text and "number of negative keys (default: 4096)" in text
    assert "A test recipe." in text
    text = " ".join(text.split())
    assert "Refused where the loss couples the samples" in text  # gradient accumulation
    assert "--grad-cache-chunk" in text and "gradient caching (Gao et al. 2021)" in text


def test_unknown_flag_names_closest_field(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_config(_Recipe, ["--queue-sise", "5"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unknown option '--queue-sise'" in err and "--queue-size" in err
    with pytest.raises(SystemExit):  # no silent prefix matching
        parse_config(_Recipe, ["--queue", "5"])


@pytest.mark.parametrize("argv, words", [
    (["--epochs", "0"], "--epochs must be positive"),
    (["--data", ""], "--data is required"),
    (["--warmup-epochs", "500", "--epochs", "10"], "--warmup-epochs"),
    (["--resume", "/no/such/ckpt"], "--resume auto"),
    (["--optimizer", "adam"], "invalid choice"),
    (["--symmetric", "maybe"], "expected true/false"),
    (["--float64", "--mixed-precision", "bf16"], "pick one"),
])
def test_bad_values_exit_with_a_message(capsys, argv, words):
    with pytest.raises(SystemExit) as exc:
        parse_config(_Recipe, argv)
    assert exc.value.code == 2
    assert words in capsys.readouterr().err


def test_config_file_then_flags(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config_to_dict(_Recipe(queue_size=64, lr=0.1)),
                                "recipe": "x", "resolved": {"a": 1}}))
    cfg = parse_config(_Recipe, ["--config", str(path), "--lr", "0.2"])
    assert cfg.queue_size == 64 and cfg.lr == 0.2


def test_dict_round_trip_and_unknown_key():
    cfg = _Recipe(betas=(0.5, 0.6), queue_size=7)
    assert config_from_dict(_Recipe, json.loads(json.dumps(config_to_dict(cfg)))) == cfg
    with pytest.raises(KeyError, match="queue_sise"):
        config_from_dict(_Recipe, {"queue_sise": 3})
