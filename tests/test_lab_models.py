"""The tiny models are made locally: a LlamaForCausalLM config per size, a generation config,
a tokenizer with a chat template; the tokenizer is trained by the lab environment's Python."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from router.lab import SIZES, find_environment, lab_home, make_model, model_size
from router.lab.kinds import KINDS
from router.lab.models import write_model_config


def test_each_size_is_a_llama_config_of_its_depth_and_width(tmp_path: Path) -> None:
    for size in SIZES.values():
        directory = tmp_path / size.name
        directory.mkdir()
        write_model_config(directory, size)
        config = json.loads((directory / "config.json").read_text())
        assert config["architectures"] == ["LlamaForCausalLM"]
        assert (config["num_hidden_layers"], config["hidden_size"]) == (size.layers, size.hidden)
        assert config["vocab_size"] == 8192
        assert config["max_position_embeddings"] >= 2048
        generation = json.loads((directory / "generation_config.json").read_text())
        assert generation["eos_token_id"] == config["eos_token_id"]
        tokenizer = json.loads((directory / "tokenizer_config.json").read_text())
        assert "add_generation_prompt" in tokenizer["chat_template"]


def test_the_two_sizes_differ_in_depth_and_width() -> None:
    small, large = model_size("small"), model_size("large")
    assert large.layers >= 3 * small.layers
    assert large.hidden > small.hidden


def test_a_whole_model_with_its_trained_tokenizer(tmp_path: Path) -> None:
    environment = find_environment(lab_home(), KINDS["vllm"])
    if environment is None:
        pytest.skip("the tokenizer is trained by the lab environment: gpurouter lab vllm build")
    directory = make_model(model_size("small"), tmp_path, environment.python)
    tokenizer = json.loads((directory / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    assert len(vocab) == 8192
    assert [vocab[t] for t in ("<|begin|>", "<|end|>", "<|pad|>")] == [0, 1, 2]
    assert make_model(model_size("small"), tmp_path, environment.python) == directory
