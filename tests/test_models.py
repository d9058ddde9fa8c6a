"""The tiny pair: cache, manifest, quality, GGUF export, cross-engine check and its CLI."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agents.engines.base import TokenizerMismatchError, check_same_tokenizer
from agents.workloads.arithmetic import full_text, train_problems
from testbed.cli import app
from testbed.core.errors import BadInputError, ExitCode
from testbed.models import tiny
from testbed.models.check import check_pair, resolve_model, resolve_pair
from testbed.models.configs import DRAFT, ModelSpec
from testbed.models.tokenizer import SPECIALS, train_tokenizer
from testbed.models.train import TrainSpec

runner = CliRunner()


# --- cache ------------------------------------------------------------------------------------


def test_second_call_is_a_cache_hit(tiny_pair, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_build(*args: object) -> None:
        raise AssertionError("the pair was rebuilt although it is cached")

    monkeypatch.setattr(tiny, "build_pair", no_build)
    again = tiny.ensure_tiny_pair()
    assert again.root == tiny_pair.root
    assert again.manifest == tiny_pair.manifest
    assert tiny_pair.root.name == tiny.recipe_hash(tiny.TinyRecipe())


def test_recipe_hash_covers_every_setting() -> None:
    base = tiny.TinyRecipe()
    assert tiny.recipe_hash(base) == tiny.recipe_hash(tiny.TinyRecipe())
    variants = [
        dataclasses.replace(base, version=base.version + 1),
        dataclasses.replace(base, train_seed=7),
        dataclasses.replace(base, n_train=100),
        dataclasses.replace(base, draft=dataclasses.replace(DRAFT, hidden=32)),
        dataclasses.replace(base, target_train=TrainSpec(steps=601, lr=4e-3)),
        dataclasses.replace(base, draft_train=TrainSpec(steps=400, lr=5e-3, threads=1)),
    ]
    hashes = {tiny.recipe_hash(v) for v in variants}
    assert len(hashes) == len(variants) and tiny.recipe_hash(base) not in hashes


def test_a_crashed_build_leaves_no_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESTBED_CACHE", str(tmp_path))

    def crash(root: Path, *args: object) -> None:
        root.mkdir(parents=True)
        (root / "draft.gguf").write_bytes(b"half")
        raise RuntimeError("killed mid-build")

    monkeypatch.setattr(tiny, "build_pair", crash)
    with pytest.raises(RuntimeError, match="mid-build"):
        tiny.ensure_tiny_pair()
    left = [p.name for p in (tmp_path / "tiny").iterdir() if not p.name.endswith(".lock")]
    assert left == []


def test_copy_to_out(tiny_pair, tmp_path: Path) -> None:
    out = tmp_path / "pair"
    copy = tiny.ensure_tiny_pair(out)
    assert copy.root == out and copy.draft_gguf == out / "draft.gguf"
    assert tiny.verify_pair(copy) == []
    assert copy.manifest == tiny_pair.manifest
    stamp = (out / "target.gguf").stat().st_mtime_ns
    tiny.ensure_tiny_pair(out)  # already there: nothing copied again
    assert (out / "target.gguf").stat().st_mtime_ns == stamp


def test_load_pair_refuses_incomplete_folders(tiny_pair, tmp_path: Path) -> None:
    with pytest.raises(tiny.PairError, match="no manifest.json"):
        tiny.load_pair(tmp_path)
    shutil.copy(tiny_pair.root / "manifest.json", tmp_path / "manifest.json")
    with pytest.raises(tiny.PairError, match="is missing"):
        tiny.load_pair(tmp_path)


# --- manifest and quality ---------------------------------------------------------------------


def test_manifest_describes_the_pair(tiny_pair) -> None:
    m = tiny_pair.manifest
    assert m["recipe_hash"] == tiny_pair.root.name
    assert tiny.verify_pair(tiny_pair) == []
    expected = {
        "manifest.json",
        "draft.gguf",
        "target.gguf",
        "draft/config.json",
        "draft/model.safetensors",
        "draft/tokenizer.json",
        "target/model.safetensors",
    }
    assert expected - {"manifest.json"} <= set(m["files"])
    for role, spec, _ in tiny.TinyRecipe().models():
        assert f"{role}.gguf" in m["files"] and f"{role}/model.safetensors" in m["files"]
        info = m["models"][role]
        assert info["shape"]["layers"] == spec.layers and info["shape"]["hidden"] == spec.hidden
        assert info["shape"]["vocab_size"] == m["tokenizer"]["vocab_size"]
        assert info["train"]["seed"] == 0 and info["train"]["steps"] > 0
        assert info["train"]["wall_s"] > 0
        assert info["heldout"]["n"] == 200
    assert 200_000 < m["models"]["draft"]["params"] < 500_000
    assert 1_000_000 < m["models"]["target"]["params"] < 1_600_000
    assert tiny_pair.draft_names[0] == "draft" and len(tiny_pair.draft_names) >= 3
    assert len(m["tokenizer"]["hash"]) == 64


def test_target_clearly_beats_draft(tiny_pair) -> None:
    models = tiny_pair.manifest["models"]
    draft, target = models["draft"]["heldout"], models["target"]["heldout"]
    assert target["exact_match"] >= draft["exact_match"] + 0.1, (draft, target)
    assert target["exact_match"] >= 0.15
    agreement = tiny_pair.manifest["agreement"]
    assert 0.6 <= agreement["draft_vs_target_greedy"] < 1.0
    assert agreement["tokens"] > 1000


def test_draft_grades_are_graded(tiny_pair) -> None:
    """The graded family spans weaker and stronger drafts than the default: the smallest
    agrees with the target less than the default, the largest more, every one below it."""
    models = tiny_pair.manifest["models"]
    agree = {n: models[n]["agreement"]["draft_vs_target_greedy"] for n in tiny_pair.draft_names}
    assert min(agree.values()) < agree["draft"] < max(agree.values()) < 1.0, agree
    for name in tiny_pair.draft_names:
        assert models[name]["heldout"]["exact_match"] < models["target"]["heldout"]["exact_match"]
    with pytest.raises(tiny.PairError, match="no draft"):
        tiny_pair.draft_files("draft-nope")


# --- parts of the recipe ----------------------------------------------------------------------


def test_tokenizer_keeps_digits_single_and_specials_first() -> None:
    tok = train_tokenizer([full_text(p) for p in train_problems(500)], 400)
    assert [tok.token_to_id(s) for s in SPECIALS] == [0, 1, 2]
    vocab = tok.get_vocab()
    assert all(len(t) == 1 for t in vocab if any(c.isdigit() for c in t))
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(["x"], 100)


def test_training_is_deterministic(tiny_pair) -> None:
    import torch
    from tokenizers import Tokenizer

    from testbed.models.configs import llama_config
    from testbed.models.train import encode_packed, train_model

    tok = Tokenizer.from_file(str(tiny_pair.draft_hf / "tokenizer.json"))
    data = encode_packed(tok, train_problems(200), 64, 0, 1)
    config = llama_config(ModelSpec(1, 32, 64, 2, 2), tok.get_vocab_size())
    spec = TrainSpec(steps=3, lr=1e-3, batch_size=8)
    a, res = train_model(config, data, spec)
    b, _ = train_model(config, data, spec)
    assert res.steps == 3 and res.params == sum(p.numel() for p in a.parameters())
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name


def test_model_spec_validation() -> None:
    with pytest.raises(ValueError, match="heads"):
        ModelSpec(layers=1, hidden=64, ffn=64, heads=3, kv_heads=1)


def test_gguf_export_names_the_bad_field(tiny_pair, tmp_path: Path) -> None:
    from testbed.models.gguf_export import ExportError, export_gguf

    bad = tmp_path / "bad"
    shutil.copytree(tiny_pair.draft_hf, bad)
    cfg = json.loads((bad / "config.json").read_text())
    del cfg["vocab_size"]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ExportError, match=r"config.json: field 'vocab_size' is missing"):
        export_gguf(bad, tmp_path / "bad.gguf")
    assert not list(tmp_path.glob("bad.gguf*"))


# --- cross-engine check -----------------------------------------------------------------------


def test_check_pair_is_identical_across_engines(tiny_pair) -> None:
    report = check_pair(tiny_pair.root, n_prompts=20)
    for m in (report.draft, report.target):
        assert m.strings >= 50 and m.prompts == 20
        assert m.tokenizer_agreement == 1.0, m.mismatches
        assert m.round_trip_ok == m.strings
        assert m.greedy_agreement == 1.0, m.mismatches
        assert m.max_logit_diff is not None and m.max_logit_diff < 1e-3
        assert set(m.hashes.values()) == {tiny_pair.tokenizer_hash}
    assert report.all_identical and report.tokenizer_hash == tiny_pair.tokenizer_hash


def test_resolve_models(tiny_pair, tmp_path: Path) -> None:
    src = resolve_model(tiny_pair.target_gguf)
    assert (src.hf_dir, src.gguf) == (tiny_pair.target_hf, tiny_pair.target_gguf)
    src = resolve_model(tiny_pair.draft_hf)
    assert (src.hf_dir, src.gguf) == (tiny_pair.draft_hf, tiny_pair.draft_gguf)
    d, t = resolve_pair(tiny_pair.root, None)
    assert (d.hf_dir, t.gguf) == (tiny_pair.draft_hf, tiny_pair.target_gguf)
    lone = tmp_path / "lone.gguf"
    shutil.copy(tiny_pair.draft_gguf, lone)
    assert resolve_model(lone).hf_dir is None
    with pytest.raises(BadInputError, match="no such file"):
        resolve_model(tmp_path / "nothing")
    assert resolve_model(tmp_path).gguf == lone  # a folder holding one .gguf
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadInputError, match="expected an HF model folder"):
        resolve_model(tmp_path / "empty")
    with pytest.raises(BadInputError, match="tiny-pair folder"):
        resolve_pair(tiny_pair.draft_hf, None)


@pytest.fixture(scope="module")
def other_tokenizer_model(tiny_pair, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained model with a different (smaller) tokenizer, as HF folder and GGUF."""
    import torch
    from transformers import LlamaForCausalLM

    from testbed.models.configs import llama_config
    from testbed.models.gguf_export import export_gguf
    from testbed.models.tokenizer import save_tokenizer

    root = tmp_path_factory.mktemp("other")
    tok = train_tokenizer([full_text(p) for p in train_problems(300)], 320)
    torch.manual_seed(0)
    model = LlamaForCausalLM(llama_config(ModelSpec(1, 32, 64, 2, 2), tok.get_vocab_size()))
    model.save_pretrained(root / "other")
    save_tokenizer(tok, root / "other")
    export_gguf(root / "other", root / "other.gguf")
    return root / "other"


def test_tokenizer_mismatch_is_refused(tiny_pair, other_tokenizer_model: Path) -> None:
    from agents.engines.llama_cpp import LlamaCppEngine
    from agents.engines.torch_hf import TorchEngine, hf_tokenizer_hash

    other_hash = hf_tokenizer_hash(other_tokenizer_model)
    assert other_hash != tiny_pair.tokenizer_hash
    with pytest.raises(TokenizerMismatchError) as err:
        check_pair(other_tokenizer_model, tiny_pair.target_hf)
    assert other_hash in str(err.value) and tiny_pair.tokenizer_hash in str(err.value)

    with LlamaCppEngine(other_tokenizer_model.with_suffix(".gguf")) as device:
        assert device.tokenizer_hash == other_hash
        server = TorchEngine(tiny_pair.target_hf)
        with pytest.raises(TokenizerMismatchError, match=other_hash[:16]):
            check_same_tokenizer(device, server)
        check_same_tokenizer(server, TorchEngine(tiny_pair.draft_hf))


# --- CLI --------------------------------------------------------------------------------------


def test_cli_build_tiny_reports_the_cached_pair(tiny_pair, tmp_path: Path) -> None:
    res = runner.invoke(app, ["models", "build-tiny"])
    assert res.exit_code == 0, res.output
    assert str(tiny_pair.root) in res.output.replace("\n", "")
    draft_acc = tiny_pair.manifest["models"]["draft"]["heldout"]["exact_match"]
    assert f"{draft_acc:.1%}" in res.output
    res = runner.invoke(app, ["models", "build-tiny", "--out", str(tmp_path / "copy")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "copy" / "target.gguf").is_file()


def test_cli_check_refuses_a_mismatch(tiny_pair, other_tokenizer_model: Path) -> None:
    res = runner.invoke(
        app,
        ["models", "check", str(other_tokenizer_model), str(tiny_pair.target_gguf)],
        terminal_width=300,
    )
    assert res.exit_code == ExitCode.BAD_INPUT
    assert "refused" in res.output and "tokenizer mismatch" in res.output
    assert tiny_pair.tokenizer_hash in res.output


def test_cli_check_reports_a_table(tiny_pair) -> None:
    res = runner.invoke(
        app,
        ["models", "check", str(tiny_pair.root), "--prompts", "3", "--strict"],
        terminal_width=200,
    )
    assert res.exit_code == 0, res.output
    assert "tokenizer ids agree" in res.output and "100.0%" in res.output
    res = runner.invoke(app, ["models", "check", "/nonexistent/model"])
    assert res.exit_code == ExitCode.BAD_INPUT


def test_gguf_export_matches_pytorch_on_fresh_weights(tiny_pair, tmp_path: Path) -> None:
    """Independent of the cached pair: a random GQA model exported now gives the same logits."""
    import numpy as np
    import torch
    from tokenizers import Tokenizer
    from transformers import LlamaForCausalLM

    from agents.engines.llama_cpp import LlamaCppEngine
    from agents.engines.torch_hf import TorchEngine
    from testbed.models.configs import llama_config
    from testbed.models.gguf_export import export_gguf
    from testbed.models.tokenizer import save_tokenizer

    tok_dir = tiny_pair.target_hf
    config = llama_config(
        ModelSpec(2, 64, 128, 4, 2), tiny_pair.manifest["tokenizer"]["vocab_size"]
    )
    config.initializer_range = 0.3  # large weights: a wrong Q/K layout shows in the logits
    torch.manual_seed(1)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "m")
    save_tokenizer(Tokenizer.from_file(str(tok_dir / "tokenizer.json")), tmp_path / "m")
    export_gguf(tmp_path / "m", tmp_path / "m.gguf")
    hf, gg = TorchEngine(tmp_path / "m"), LlamaCppEngine(tmp_path / "m.gguf")
    ids = hf.tokenize(full_text(train_problems(1)[0]))
    a, b = hf.score(hf.open(), ids), gg.score(gg.open(), ids)
    assert np.abs(a).max() > 1.0
    assert np.abs(a - b).max() < 1e-4 * np.abs(a).max()
    assert (a.argmax(-1) == b.argmax(-1)).all()
    gg.unload()
