"""Config dataclass <-> command line."""

from __future__ import annotations

import dataclasses
import json

import pytest

from contrastive.engine import (
    ImageConfig,
    LabelledTextConfig,
    config_from_dict,
    config_to_dict,
    help_field,
    override,
    parse_config,
)
from contrastive.engine.fields import field_options


@dataclasses.dataclass
class _Recipe(ImageConfig):
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


def test_config_file_warmup_from_the_fraction_follows_new_flags(tmp_path):
    """A run's config.json records the warm-up that --warmup-fraction derived (10 % of 1000
    steps = 100): with another --steps it is 10 % of those, not the file's 100 (which made a
    200-step run warm up for half of it and refused --steps 50); a warm-up the file sets
    otherwise is kept, and a flag still wins."""
    path, explicit = tmp_path / "config.json", tmp_path / "explicit.json"
    path.write_text(json.dumps(config_to_dict(parse_config(LabelledTextConfig, []))))
    assert json.loads(path.read_text())["warmup_steps"] == 100
    explicit.write_text(json.dumps(config_to_dict(
        parse_config(LabelledTextConfig, ["--warmup-steps", "37"]))))

    def warmup(file, *flags):
        cfg = parse_config(LabelledTextConfig, ["--config", str(file), *flags])
        return cfg.warmup_steps, cfg.warmup_epochs

    assert warmup(path) == (100, 0.0)
    assert warmup(path, "--steps", "200") == (20, 0.0)
    assert warmup(path, "--steps", "50") == (5, 0.0)
    assert warmup(path, "--steps", "0", "--epochs", "5") == (0, 0.5)  # an --epochs budget
    assert warmup(path, "--steps", "200", "--warmup-steps", "7") == (7, 0.0)
    assert warmup(explicit, "--steps", "200") == (37, 0.0)


def test_dict_round_trip_and_unknown_key():
    cfg = _Recipe(betas=(0.5, 0.6), queue_size=7)
    assert config_from_dict(_Recipe, json.loads(json.dumps(config_to_dict(cfg)))) == cfg
    with pytest.raises(KeyError, match="queue_sise"):
        config_from_dict(_Recipe, {"queue_sise": 3})


def _refusal(capsys, cls, argv) -> str:
    """The one-line error ``parse_config(cls, argv)`` exits with (status 2)."""
    with pytest.raises(SystemExit) as exc:
        parse_config(cls, argv)
    assert exc.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_epochs_beside_a_positive_steps_budget_is_refused_not_ignored(capsys):
    """--steps, when positive, is the budget and --epochs is unused: LabelledTextConfig (the text
    recipes: lrc_bert, bert_finetune) defaults to --steps 1000 and DualEncoderConfig (clip,
    siglip) to 300, so 'lrc_bert.py --epochs 5' trained 1000 steps without a word. An --epochs
    given on the command line is refused whenever --steps is positive (the default or given
    too: the flag, not its value, counts); --steps 0 --epochs N and --steps N alone work."""
    from contrastive.engine import DualEncoderConfig

    err = _refusal(capsys, LabelledTextConfig, ["--epochs", "5"])
    assert err.endswith("--epochs 5 is ignored: the budget is --steps 1000 (this recipe's "
                        "default); pass --steps 0 --epochs 5 for 5 passes over the data, or "
                        "--steps N alone")
    assert "--steps 300 (this recipe's default)" in _refusal(capsys, DualEncoderConfig,
                                                             ["--epochs", "5"])
    assert "--epochs 100 is ignored" in _refusal(capsys, LabelledTextConfig, ["--epochs", "100"])
    assert "--steps 200 (given too)" in _refusal(capsys, LabelledTextConfig,
                                                 ["--steps", "200", "--epochs", "5"])
    assert "--steps 50 (given too)" in _refusal(capsys, _Recipe, ["--steps", "50", "--epochs", "5"])
    cfg = parse_config(LabelledTextConfig, ["--steps", "0", "--epochs", "5"])
    assert (cfg.steps, cfg.epochs) == (0, 5)
    assert parse_config(LabelledTextConfig, ["--steps", "200"]).steps == 200
    assert parse_config(DualEncoderConfig, []).steps == 300
    assert parse_config(_Recipe, ["--epochs", "5"]).epochs == 5  # steps 0: --epochs is the budget


def test_a_config_files_budget_counts_where_it_differs_from_the_default(tmp_path, capsys):
    """A run's config.json records every field (epochs 100 beside steps 1000 too): resuming
    from it (--config, --resume auto, --allow-config-change) is no --epochs choice; a value it
    changed is, unless the command line names --epochs or --steps (the flag then decides)."""
    def run_file(name, *flags):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(config_to_dict(parse_config(LabelledTextConfig, list(flags)))))
        return str(path)

    default, epochs5 = run_file("default"), run_file("epochs5", "--steps", "0", "--epochs", "5")
    steps500 = run_file("steps500", "--steps", "500")
    again = ["--resume", "auto", "--allow-config-change"]
    assert parse_config(LabelledTextConfig, ["--config", default, *again]).steps == 1000
    cfg = parse_config(LabelledTextConfig, ["--config", epochs5, *again])
    assert (cfg.steps, cfg.epochs) == (0, 5)
    cfg = parse_config(LabelledTextConfig, ["--config", epochs5, "--steps", "200"])
    assert (cfg.steps, cfg.epochs) == (200, 5)  # --steps wins over the file's epoch budget
    assert parse_config(LabelledTextConfig, ["--config", steps500, *again]).steps == 500
    hand = tmp_path / "hand.json"
    hand.write_text(json.dumps({"epochs": 5}))
    assert "--steps 1000 (this recipe's default)" in _refusal(
        capsys, LabelledTextConfig, ["--config", str(hand)])
    assert f"--steps 500 (from --config {steps500})" in _refusal(
        capsys, LabelledTextConfig, ["--config", steps500, "--epochs", "5"])


@dataclasses.dataclass
class _Narrow(ImageConfig):
    """A recipe that changes defaults of declared fields."""

    data: str = "shapes"
    lr_scaling: str = override("none", "lr is absolute here")
    optimizer: str = "adamw"  # a bare default keeps the declared choices and help too
    lr_schedule: str = override("constant", only=("constant", "step"), why="a test's reason")


def test_override_keeps_the_declared_choices_and_help(capsys):
    scaling = field_options(_Narrow, "lr_scaling")
    assert scaling["choices"] == field_options(ImageConfig, "lr_scaling")["choices"]
    assert scaling["help"].startswith("lr is absolute here. linear: used lr = lr * batch_size")
    assert field_options(_Narrow, "optimizer") == field_options(ImageConfig, "optimizer")
    assert parse_config(_Narrow, ["--lr-scaling", "sqrt"]).lr_scaling == "sqrt"
    assert parse_config(_Narrow, []).lr_scaling == "none"
    schedule = field_options(_Narrow, "lr_schedule")
    assert schedule["choices"] == ("constant", "step") and "a test's reason" in schedule["help"]
    with pytest.raises(SystemExit):
        parse_config(_Narrow, ["--lr-schedule", "linear"])
    assert "invalid choice: 'linear'" in capsys.readouterr().err


def test_override_refuses_a_copied_or_unreasoned_choice_list():
    with pytest.raises(TypeError, match="needs why"):
        override("sgd", only=("sgd",))

    @dataclasses.dataclass
    class Copied(ImageConfig):
        optimizer: str = help_field("sgd", "SGD", choices=("sgd", "adamw"))

    with pytest.raises(TypeError, match="override"):
        field_options(Copied, "optimizer")

    @dataclasses.dataclass
    class Wider(ImageConfig):
        optimizer: str = override("sgd", only=("sgd", "adam"), why="a typo")

    with pytest.raises(TypeError, match="not a subset"):
        field_options(Wider, "optimizer")

    @dataclasses.dataclass
    class New(ImageConfig):
        queue: int = override(16, "no base declares it")

    with pytest.raises(TypeError, match="use help_field"):
        field_options(New, "queue")


def test_old_bert_size_flags_still_parse_with_a_notice():
    """Issue 48's renames: the dual encoder's --text-layers/--text-width/--text-heads/
    --text-dropout and simcse's --intermediate (a width) fill the one spelling; lrc_bert's
    --intermediate cosnce|mse (a loss) fills --layer-loss: the value tells the two apart."""
    from contrastive.engine import DualEncoderConfig

    with pytest.warns(FutureWarning, match="--text-width is renamed --hidden"):
        cfg = parse_config(DualEncoderConfig, ["--text-layers", "3", "--text-width=32",
                                               "--text-heads", "4", "--text-dropout", "0"])
    assert (cfg.layers, cfg.hidden, cfg.heads, cfg.dropout) == (3, 32, 4, 0.0)

    @dataclasses.dataclass
    class Distil(LabelledTextConfig):
        layer_loss: str = help_field("cosnce", "a loss", choices=("cosnce", "mse"))

    with pytest.warns(FutureWarning, match="--intermediate is renamed --layer-loss"):
        assert parse_config(Distil, ["--intermediate", "mse"]).layer_loss == "mse"
    with pytest.warns(FutureWarning, match="--intermediate is renamed --intermediate-size"):
        cfg = parse_config(Distil, ["--intermediate=48"])
    assert (cfg.intermediate_size, cfg.layer_loss) == (48, "cosnce")
    with pytest.warns(FutureWarning, match="'intermediate' is renamed 'layer_loss'"):
        assert config_from_dict(Distil, {"intermediate": "mse"}).layer_loss == "mse"
    with pytest.warns(FutureWarning, match="'intermediate' is renamed 'intermediate_size'"):
        assert config_from_dict(LabelledTextConfig, {"intermediate": 64}).intermediate_size == 64


def test_a_resumed_run_reads_old_names_by_their_values():
    """A checkpoint's config of before the renames compares equal under the new names."""
    from contrastive.engine.compat import upgrade_config

    defaults = {"layers": 2, "hidden": 64, "intermediate_size": 0, "layer_loss": "cosnce"}
    old = {"text_layers": 3, "hidden": 64, "intermediate_size": 1200, "intermediate": "mse"}
    assert upgrade_config(old, defaults) == {"layers": 3, "hidden": 64,
                                             "intermediate_size": 1200, "layer_loss": "mse"}


def test_the_image_configuration_s_old_name_still_imports_with_a_notice():
    """``TrainConfig`` (before the kits) is ``ImageConfig`` with a FutureWarning."""
    import contrastive.engine as engine

    with pytest.warns(FutureWarning, match="TrainConfig is renamed ImageConfig"):
        old = engine.TrainConfig
    assert old is ImageConfig
    with pytest.raises(AttributeError):
        engine.NoSuchConfig  # noqa: B018
