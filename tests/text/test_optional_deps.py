"""Without the ``text`` extra: the library imports, text features fail in one line naming it."""

from __future__ import annotations

import subprocess
import sys

BLOCKED = ("transformers", "tokenizers")

CODE = f"""
import importlib.abc, sys, tempfile, pathlib
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ImportError(f"{{name}} is blocked by the test")
        return None
sys.meta_path.insert(0, Block())
for name in {BLOCKED!r}:
    sys.modules.pop(name, None)

import torch
import contrastive, contrastive.losses, contrastive.nn, contrastive.text
from contrastive.text import MissingTextDependencyError, generate_sentiment, generate_nli, glue_metrics
assert contrastive.get_loss("ntxent")(torch.randn(4, 8), torch.randn(4, 8)).isfinite()
assert len(generate_sentiment(20)) == 20 and len(generate_nli(5)) == 5
assert glue_metrics("sst2", [1, 0], [1, 1])["accuracy"] == 0.5
assert "text" in dir(contrastive) and callable(contrastive.text.load_glue)

folder = pathlib.Path(tempfile.mkdtemp())
(folder / "config.json").write_text("{{}}")
(folder / "model.safetensors").write_bytes(b"")
(folder / "vocab.txt").write_text("[PAD]\\n")
calls = {{
    "bert": lambda: contrastive.nn.create_encoder("bert"),
    "hf": lambda: contrastive.nn.create_encoder(f"hf:{{folder}}"),
    "train_wordpiece": lambda: contrastive.text.train_wordpiece(["a b"]),
    "load_tokenizer": lambda: contrastive.text.load_tokenizer(folder),
}}
for what, call in calls.items():
    try:
        call()
    except MissingTextDependencyError as err:
        msg = str(err)
        assert "\\n" not in msg and 'pip install -e ".[text]"' in msg, (what, msg)
        print(what, "->", msg)
    else:
        raise AssertionError(f"{{what}} worked without transformers / tokenizers")
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {BLOCKED!r})
assert not loaded, loaded
print("ok")
"""


def test_library_works_without_the_text_extra_and_text_features_name_it():
    result = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("ok")
    assert result.stdout.count('pip install -e ".[text]"') == 4
