"""Tiny Llama-architecture models, made locally: nothing is downloaded.

A model directory holds ``config.json`` (LlamaForCausalLM), ``generation_config.json``, a
byte-level BPE tokenizer trained on the lab Python's own standard library, and a chat template.
There are no weight files: engines load random ones (``--load-format dummy``), which makes
the text nonsense and the speed real. Models are cached like environments: made under a
temporary name, renamed into place once complete.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from router.lab.child_env import child_env
from router.lab.errors import LabError
from router.lab.locks import locked

__all__ = ["SIZES", "ModelSize", "make_model", "model_size", "write_model_config"]

_VOCAB = 8192
_SPECIALS = ("<|begin|>", "<|end|>", "<|pad|>")
"""Special tokens, trained first: ids 0, 1 and 2."""
_MARKER = "gpurouter-lab-model.json"
_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)
# Run by the lab environment's Python, which has `tokenizers` (vLLM brings it). Trained on
# the top level of that Python's standard library: local text, a few seconds.
_TRAIN_TOKENIZER = """\
import pathlib, sys, sysconfig
from tokenizers import ByteLevelBPETokenizer
out, vocab, specials = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
files = sorted(str(p) for p in stdlib.glob("*.py"))
tokenizer = ByteLevelBPETokenizer()
tokenizer.train(files, vocab_size=vocab, min_frequency=2, special_tokens=specials,
                show_progress=False)
tokenizer.save(str(out / "tokenizer.json"))
"""


@dataclass(frozen=True, slots=True)
class ModelSize:
    """One tiny model: depth and width decide its speed."""

    name: str
    """``small`` or ``large`` on the command line."""
    layers: int
    hidden: int
    heads: int = 8

    @property
    def directory_name(self) -> str:
        return f"tiny-llama-{self.layers}x{self.hidden}"


SIZES: dict[str, ModelSize] = {
    # About 3x apart in speed on one CPU core (docs/real-engines.md has the measured figures).
    "small": ModelSize("small", layers=2, hidden=256),
    "large": ModelSize("large", layers=8, hidden=512),
}


def model_size(name: str) -> ModelSize:
    """The size called ``name``; LabError naming the known ones otherwise."""
    try:
        return SIZES[name]
    except KeyError:
        raise LabError(f"no model size called {name!r} (known: {', '.join(SIZES)})") from None


def make_model(size: ModelSize, models_dir: Path, python: Path) -> Path:
    """The directory of ``size``'s model under ``models_dir``, made first if needed.

    ``python`` is the lab environment's, which trains the tokenizer.
    """
    with locked(models_dir / ".lock"):
        return _make(size, models_dir, python)


def _make(size: ModelSize, models_dir: Path, python: Path) -> Path:
    target = models_dir / size.directory_name
    recipe = _recipe(size)
    if _recorded_recipe(target) == recipe:
        return target
    partial = models_dir / f".{size.directory_name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        write_model_config(partial, size)
        _train_tokenizer(partial, python)
        (partial / _MARKER).write_text(json.dumps(recipe, indent=2) + "\n")
        if target.exists():
            shutil.rmtree(target)
        partial.rename(target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return target


def write_model_config(directory: Path, size: ModelSize) -> None:
    """Everything of the model but the trained tokenizer: config, generation config, the
    tokenizer's settings and chat template."""
    bos, eos, pad = range(len(_SPECIALS))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": _VOCAB,
        "hidden_size": size.hidden,
        "intermediate_size": 4 * size.hidden,
        "num_hidden_layers": size.layers,
        "num_attention_heads": size.heads,
        "num_key_value_heads": size.heads,
        "head_dim": size.hidden // size.heads,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    generation = {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad}
    tokenizer = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": _SPECIALS[bos],
        "eos_token": _SPECIALS[eos],
        "pad_token": _SPECIALS[pad],
        "model_max_length": 2048,
        "clean_up_tokenization_spaces": False,
        "chat_template": _CHAT_TEMPLATE,
    }
    for name, content in (
        ("config.json", config),
        ("generation_config.json", generation),
        ("tokenizer_config.json", tokenizer),
    ):
        (directory / name).write_text(json.dumps(content, indent=2) + "\n")


def _train_tokenizer(directory: Path, python: Path) -> None:
    argv = [str(python), "-c", _TRAIN_TOKENIZER, str(directory), str(_VOCAB), *_SPECIALS]
    done = subprocess.run(argv, capture_output=True, text=True, env=child_env(), check=False)
    if done.returncode != 0:
        tail = "\n".join(f"  {line}" for line in done.stderr.splitlines()[-10:])
        raise LabError(f"training the tiny models' tokenizer with {python} failed:\n{tail}")


def _recipe(size: ModelSize) -> dict[str, Any]:
    return {"size": asdict(size), "vocab": _VOCAB, "template": _CHAT_TEMPLATE, "version": 1}


def _recorded_recipe(directory: Path) -> Any:
    try:
        return json.loads((directory / _MARKER).read_text())
    except (OSError, ValueError):
        return None
