"""Both engines on the tiny pair: tokenizers, scoring, rollback, batching, drafting."""

from __future__ import annotations

import numpy as np
import pytest

from agents.engines.base import Engine
from agents.engines.llama_cpp import LlamaCppEngine, read_gguf_vocab
from agents.engines.torch_hf import TorchEngine, hf_tokenizer_hash
from agents.workloads.arithmetic import full_text, heldout_problems, prompt
from testbed.models.check import sample_strings

ATOL = 1e-4  # float32 logits of the same model, batched vs one at a time


@pytest.fixture(scope="module")
def engines(tiny_pair) -> dict[str, Engine]:
    built: dict[str, Engine] = {}
    for role in ("draft", "target"):
        built[f"torch-{role}"] = TorchEngine(getattr(tiny_pair, f"{role}_hf"), threads=2)
        built[f"llama-{role}"] = LlamaCppEngine(getattr(tiny_pair, f"{role}_gguf"), n_threads=2)
    yield built
    for name, e in built.items():
        if name.startswith("llama"):
            e.unload()


ALL = ["torch-draft", "torch-target", "llama-draft", "llama-target"]


def _ids(engine: Engine, n: int = 6, seed: int = 2) -> list[list[int]]:
    return [engine.tokenize(full_text(p)) for p in heldout_problems(n, seed)]


# --- tokenizers -------------------------------------------------------------------------------


def test_one_tokenizer_hash_everywhere(engines, tiny_pair) -> None:
    hashes = {name: e.tokenizer_hash for name, e in engines.items()}
    assert set(hashes.values()) == {tiny_pair.tokenizer_hash}, hashes
    assert hf_tokenizer_hash(tiny_pair.draft_hf) == tiny_pair.tokenizer_hash
    assert read_gguf_vocab(tiny_pair.target_gguf).tokenizer_hash == tiny_pair.tokenizer_hash
    for e in engines.values():
        assert (e.bos_id, e.eos_id) == (0, 1)


def test_tokenizers_agree_across_engines(engines) -> None:
    torch_e, llama_e = engines["torch-target"], engines["llama-target"]
    strings = sample_strings(60)
    for s in strings:
        for bos in (True, False):
            assert torch_e.tokenize(s, add_bos=bos) == llama_e.tokenize(s, add_bos=bos), s
        ids = torch_e.tokenize(s, add_bos=False)
        assert torch_e.detokenize(ids) == s
        assert llama_e.detokenize(ids) == s


def test_special_token_text_is_not_special(engines) -> None:
    for name in ("torch-target", "llama-target"):
        ids = engines[name].tokenize("a <s> b </s>", add_bos=False)
        assert 0 not in ids and 1 not in ids
        assert engines[name].detokenize([0, *ids, 1]) == "a <s> b </s>"


def test_digits_are_single_tokens(engines) -> None:
    e = engines["torch-target"]
    ids = e.tokenize("12345 + 678", add_bos=False)
    assert [e.detokenize([i]) for i in ids] == ["1", "2", "3", "4", "5", " +", " ", "6", "7", "8"]


# --- scoring and rollback ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_score_shape_and_incremental_equals_whole(engines, name) -> None:
    e = engines[name]
    ids = _ids(e, 1)[0]
    whole_sid, step_sid = e.open(), e.open()
    whole = e.score(whole_sid, ids)
    assert whole.shape == (len(ids), e.vocab_size) and whole.dtype == np.float32
    parts = [e.score(step_sid, ids[:7]), e.score(step_sid, ids[7:8]), e.score(step_sid, ids[8:])]
    np.testing.assert_allclose(np.concatenate(parts), whole, atol=ATOL)
    assert e.length(step_sid) == len(ids)
    assert e.score(step_sid, []).shape == (0, e.vocab_size)
    e.close(whole_sid)
    e.close(step_sid)


@pytest.mark.parametrize("name", ALL)
def test_rollback_truncates_the_cache(engines, name) -> None:
    e = engines[name]
    a, b = _ids(e, 2)
    sid = e.open()
    e.score(sid, a)
    e.rollback(sid, 5)
    assert e.length(sid) == 5
    # after rollback the session continues with other tokens exactly like a fresh one
    got = e.score(sid, b[5:])
    fresh = e.open()
    want = e.score(fresh, a[:5] + b[5:])[5:]
    np.testing.assert_allclose(got, want, atol=ATOL)
    e.rollback(sid, 0)
    np.testing.assert_allclose(e.score(sid, b), e.score(e.open(), b), atol=ATOL)
    e.rollback(sid, len(b))  # no-op
    with pytest.raises(ValueError, match="rollback"):
        e.rollback(sid, len(b) + 1)


@pytest.mark.parametrize("name", ["llama-draft", "llama-target"])
def test_llama_sessions_interleave(engines, name) -> None:
    """Switching sessions re-activates the right KV (shared prefixes reused)."""
    e = engines[name]
    seqs = _ids(e, 3, seed=4)
    want = [e.score(e.open(), s) for s in seqs]
    sids = [e.open() for _ in seqs]
    cut = 9
    firsts = [e.score(sid, s[:cut]) for sid, s in zip(sids, seqs)]
    seconds = [e.score(sid, s[cut:]) for sid, s in reversed(list(zip(sids, seqs)))][::-1]
    for w, f, s in zip(want, firsts, seconds):
        np.testing.assert_allclose(np.concatenate([f, s]), w, atol=ATOL)
    e.rollback(sids[0], cut)
    np.testing.assert_allclose(
        e.score(sids[1], [5]), e.score(e.open(), [*seqs[1], 5])[-1:], atol=ATOL
    )
    np.testing.assert_allclose(e.score(sids[0], seqs[0][cut:]), want[0][cut:], atol=ATOL)


@pytest.mark.parametrize("name", ALL)
def test_bad_calls_say_what_is_wrong(engines, name) -> None:
    e = engines[name]
    with pytest.raises(KeyError, match="unknown session 99999"):
        e.score(99999, [1])
    sid = e.open()
    with pytest.raises(ValueError, match="out of range"):
        e.score(sid, [e.vocab_size])
    e.close(sid)
    with pytest.raises(KeyError, match="unknown session"):
        e.length(sid)


def test_llama_context_limit(engines) -> None:
    e = engines["llama-draft"]
    sid = e.open()
    with pytest.raises(ValueError, match="n_ctx"):
        e.score(sid, [5] * (e.n_ctx + 1))
    assert e.length(sid) == 0


# --- batched scoring (PyTorch) ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["torch-draft", "torch-target"])
def test_batched_scoring_equals_one_at_a_time(engines, name) -> None:
    e = engines[name]
    seqs = _ids(e, 5, seed=7)
    # sessions of different lengths (one empty), scored with different numbers of new tokens
    cuts = [0, 5, 11, 17, 23]
    news = [4, 1, 7, 3, 0]
    single, batch = [], []
    for seq, cut in zip(seqs, cuts):
        s1, s2 = e.open(), e.open()
        if cut:
            e.score(s1, seq[:cut])
            e.score(s2, seq[:cut])
        single.append(s1)
        batch.append(s2)
    req = {sid: seq[cut : cut + k] for sid, seq, cut, k in zip(batch, seqs, cuts, news)}
    got = e.score_batch(req)
    for s1, s2, seq, cut, k in zip(single, batch, seqs, cuts, news):
        want = e.score(s1, seq[cut : cut + k])
        assert got[s2].shape == want.shape == (k, e.vocab_size)
        assert np.isfinite(got[s2]).all()
        np.testing.assert_allclose(got[s2], want, atol=ATOL)
        assert (got[s2].argmax(-1) == want.argmax(-1)).all()
        assert e.length(s2) == e.length(s1) == cut + k
    # the caches written back hold no padding: the next step (batched again) still matches
    req2 = {s2: seq[cut + k : cut + k + 2] for s2, seq, cut, k in zip(batch, seqs, cuts, news)}
    got2 = e.score_batch(req2)
    for s1, s2 in zip(single, batch):
        np.testing.assert_allclose(got2[s2], e.score(s1, req2[s2]), atol=ATOL)
    # and a rollback inside a batch-written cache behaves
    e.rollback(batch[2], 3)
    e.rollback(single[2], 3)
    np.testing.assert_allclose(e.score(batch[2], [7, 8]), e.score(single[2], [7, 8]), atol=ATOL)


def test_batched_greedy_equals_single_greedy(engines) -> None:
    from testbed.models.evaluate import greedy_generate

    e = engines["torch-target"]
    prompts = [e.tokenize(prompt(p)) for p in heldout_problems(8, seed=11)]
    batched = greedy_generate(e, prompts, max_new=30, batch_size=8)
    single = [greedy_generate(e, [p], max_new=30)[0] for p in prompts]
    assert batched == single


# --- greedy drafting (llama.cpp) --------------------------------------------------------------


def test_draft_greedy_matches_scored_greedy(engines) -> None:
    llama_e, torch_e = engines["llama-draft"], engines["torch-draft"]
    for p in heldout_problems(5, seed=9):
        ids = llama_e.tokenize(prompt(p))
        sid = llama_e.open()
        drafts = llama_e.draft_greedy(sid, ids, 8)
        assert 1 <= len(drafts) <= 8
        assert drafts[-1] == llama_e.eos_id or len(drafts) == 8
        assert llama_e.length(sid) == len(ids) + len(drafts) - 1
        ref = torch_e.open()
        logits = torch_e.score(ref, ids)
        want = []
        for _ in drafts:
            want.append(int(logits[-1].argmax()))
            logits = torch_e.score(ref, want[-1:])
        assert drafts == want
        # the speculative round trip: roll back to the committed prefix and continue
        llama_e.rollback(sid, len(ids) - 1)
        again = llama_e.draft_greedy(sid, ids[-1:], 8)
        assert again == drafts


def test_draft_greedy_rejects_bad_arguments(engines) -> None:
    e = engines["llama-draft"]
    sid = e.open()
    with pytest.raises(ValueError, match="k must be"):
        e.draft_greedy(sid, [0], 0)
    with pytest.raises(ValueError, match="at least one token"):
        e.draft_greedy(sid, [], 3)
