"""Which folders the load-from-disk routes take (no server): only safetensors folders under the
roots; a missing path and one outside the roots get the same answer."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from atroposlib.inference.weight_paths import adapter_folder, model_folder
from atroposlib.inference.weight_transfer import TransferError

UNKNOWN = "model_path: no checkpoint folder of this name under the server's --weight-roots"


def checkpoint(folder: Path, *files: str) -> Path:
    folder.mkdir(parents=True)
    for name in files:
        (folder / name).write_text("{}")
    return folder


@pytest.fixture
def roots(tmp_path: Path) -> list[Path]:
    return [checkpoint(tmp_path / "run" / "checkpoints")]


def refusal(path: str | Path, roots: list[Path]) -> str:
    with pytest.raises(TransferError) as refused:
        model_folder(str(path), roots)
    return str(refused.value)


def test_a_safetensors_folder_under_a_root_is_taken(roots: list[Path]) -> None:
    step = checkpoint(roots[0] / "step-3", "config.json", "model.safetensors")
    assert model_folder(str(step), roots) == step.resolve()
    relative = roots[0] / "step-3" / ".." / "step-3"
    assert model_folder(str(relative), roots) == step.resolve()


def test_missing_and_outside_the_roots_get_one_answer(roots: list[Path], tmp_path: Path) -> None:
    outside = checkpoint(tmp_path / "elsewhere", "config.json", "model.safetensors")
    escape = roots[0] / ".." / ".." / "elsewhere"
    link = roots[0] / "link"
    link.symlink_to(outside)
    answers = {
        refusal(path, roots)
        for path in (
            outside,
            escape,
            link,
            roots[0] / "missing",
            tmp_path / "missing",
            "/etc",
            f"{roots[0]}/a\0b",
            str(roots[0] / ("x" * 5000)),
        )
    }
    assert answers == {UNKNOWN}


def test_no_roots_refuses_every_path_and_names_the_setting(tmp_path: Path) -> None:
    step = checkpoint(tmp_path / "step", "config.json", "model.safetensors")
    assert "start it with --weight-roots" in refusal(step, [])


def test_pickled_weights_are_refused_inside_the_roots(roots: list[Path]) -> None:
    pickled = checkpoint(roots[0] / "step-1", "config.json", "pytorch_model.bin")
    assert "safetensors only" in refusal(pickled, roots)


def test_an_adapter_needs_its_config_and_safetensors(roots: list[Path]) -> None:
    good = checkpoint(roots[0] / "lora", "adapter_config.json", "adapter_model.safetensors")
    assert adapter_folder(str(good), roots) == good.resolve()
    pickled = checkpoint(roots[0] / "lora-bin", "adapter_config.json", "adapter_model.bin")
    with pytest.raises(TransferError, match=r"adapter_model\.safetensors"):
        adapter_folder(str(pickled), roots)
    with pytest.raises(TransferError, match="lora_path: no checkpoint folder"):
        adapter_folder(os.fspath(roots[0] / "nope"), roots)


def test_a_file_linking_out_of_the_roots_gets_the_same_answer(
    roots: list[Path], tmp_path: Path
) -> None:
    outside = checkpoint(tmp_path / "elsewhere", "config.json", "model.safetensors")
    for linked in ("model.safetensors", "config.json", "generation_config.json"):
        step = checkpoint(roots[0] / f"step-{linked}", "config.json", "model.safetensors")
        (step / linked).unlink(missing_ok=True)
        (step / linked).symlink_to(outside / ("model.safetensors" if "safe" in linked else
                                              "config.json"))  # fmt: skip
        assert refusal(step, roots) == UNKNOWN, linked
    dangling = checkpoint(roots[0] / "dangling", "config.json", "model.safetensors")
    (dangling / "tokenizer.json").symlink_to(tmp_path / "nowhere" / "tokenizer.json")
    assert refusal(dangling, roots) == UNKNOWN
    inside = checkpoint(roots[0] / "linked-within", "config.json")
    (inside / "model.safetensors").symlink_to(roots[0] / "dangling" / "model.safetensors")
    assert model_folder(str(inside), roots) == inside.resolve()  # a link within the roots


def test_an_index_naming_a_shard_outside_the_roots_gets_the_same_answer(
    roots: list[Path], tmp_path: Path
) -> None:
    checkpoint(tmp_path / "elsewhere", "model-00001-of-00001.safetensors")
    step = checkpoint(roots[0] / "sharded", "config.json", "model-00001-of-00001.safetensors")
    index = step / "model.safetensors.index.json"
    for shard, taken in (("model-00001-of-00001.safetensors", True),
                         ("../../../elsewhere/model-00001-of-00001.safetensors", False),
                         (str(tmp_path / "elsewhere" / "model-00001-of-00001.safetensors"), False),
                         ):  # fmt: skip
        index.write_text(json.dumps({"weight_map": {"lm_head.weight": shard}}))
        if taken:
            assert model_folder(str(step), roots) == step.resolve()
        else:
            assert refusal(step, roots) == UNKNOWN, shard
    for malformed in ("[]", "{", '{"weight_map": 3}'):
        index.write_text(malformed)
        assert refusal(step, roots) == UNKNOWN, malformed
