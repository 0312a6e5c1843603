"""The KV cache grows with the context (decoding.KVCache): only the positions a generation uses are allocated, growing
keeps what is stored, and generation gives the same tokens however often the cache grew."""
import numpy as np
import pytest

from fusegrad import Tensor, TinyJit
from fusegrad.engine.capture import JitError
from fusegrad.models.decoding import Generator, KVCache, kv_caches
from fusegrad.models.llama import Llama, LlamaConfig


def tiny(max_context=None):
    Tensor.manual_seed(5)
    cfg = LlamaConfig(vocab_size=37, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=4096)
    return Llama(cfg, max_context)


def test_cache_grows_keeping_its_contents_and_caps_at_max_len(monkeypatch):
    monkeypatch.setattr(KVCache, "STEP", 8)
    c = KVCache(max_len=40)
    rng = np.random.default_rng(0)
    kv = rng.standard_normal((1, 5, 2, 3)).astype(np.float32)
    c.update(Tensor(kv), Tensor(-kv), 0)
    assert c.capacity == 8
    more = rng.standard_normal((1, 6, 2, 3)).astype(np.float32)
    keys, values = c.update(Tensor(more), Tensor(-more), 5)          # 11 positions: grows to 16 (at least doubles)
    assert c.capacity == 16
    np.testing.assert_array_equal(keys.numpy(), np.concatenate([kv, more], 1))
    np.testing.assert_array_equal(values.numpy(), -np.concatenate([kv, more], 1))
    assert c.reserve(33) and c.capacity == 40                           # capped at max_len
    # stored head-major, (B, H, L, D): each head's positions contiguous
    np.testing.assert_array_equal(c.k[:, :, :11].numpy(), np.concatenate([kv, more], 1).transpose(0, 2, 1, 3))
    with pytest.raises(ValueError, match="don't fit"): c.reserve(41)


def test_a_long_context_model_allocates_what_the_generation_uses():
    m = tiny()
    assert m.max_context == 4096
    Generator(m).generate([1, 2, 3], 5)
    caches = kv_caches(m)
    assert len(caches) == 2 and all(c.capacity == KVCache.STEP for c in caches)   # not 4096


@pytest.mark.parametrize("jit", [True, False])
def test_tokens_are_the_same_however_often_the_cache_grew(monkeypatch, jit):
    want = [Generator(tiny(), jit=jit).generate([3, 1, 4], n).tokens for n in (6, 20)]
    monkeypatch.setattr(KVCache, "STEP", 4)
    m = tiny()
    g = Generator(m, jit=jit)
    got = [g.generate([3, 1, 4], n).tokens for n in (6, 20)]   # the second call grows every cache: 12 -> 24
    assert got == want
    assert all(c.capacity == 24 for c in kv_caches(m))
    # an eager forward past the capacity grows the cache too
    logits = m.forward(Tensor([[5]]), 24).numpy()
    assert all(c.capacity == 48 for c in kv_caches(m)) and np.isfinite(logits).all()


def test_growing_inside_a_tinyjit_capture_raises(monkeypatch):
    monkeypatch.setattr(KVCache, "STEP", 4)
    c = KVCache(max_len=64)
    c.update(Tensor.ones(1, 2, 1, 2), Tensor.ones(1, 2, 1, 2), 0)

    wanted = iter([5, 9, 17])

    @TinyJit
    def step(x):
        c.reserve(next(wanted))   # the first call runs plainly (grows to 8); the second captures
        return (x + 1).realize()
    step(Tensor([1.0]))
    assert c.capacity == 8
    with pytest.raises(JitError, match="grow to 9 positions inside a TinyJit capture"): step(Tensor([1.0]))


def test_the_prefills_freed_intermediates_are_given_back(monkeypatch):
    """The allocator keeps freed buffers for reuse; a prefill's intermediates (sized by the prompt) are given back
    once its outputs are computed, so they don't stay resident through the decode (SmolLM2: 23 MB)."""
    from fusegrad import Device
    import fusegrad.models.decoding as decoding
    m = tiny()
    g = Generator(m)
    seen = []
    real = decoding.release_prefill_buffers

    def spy(*outs):
        real(*outs)
        seen.append(sum(len(v) for v in Device[outs[0].device].allocator.cache.values()))
    monkeypatch.setattr(decoding, "release_prefill_buffers", spy)
    assert g.generate([3, 1, 4, 1, 5], 3).tokens == Generator(tiny()).generate([3, 1, 4, 1, 5], 3).tokens
    g.generate_batch([[3, 1], [4, 1, 5]], 2)
    assert len(seen) == 3 and seen == [0] * 3   # (the reference generation above released its own too)


@pytest.mark.parametrize("jit", [False, True])
def test_generation_keeps_no_autograd_history(jit):
    """Generation runs without autograd (decoding.inference), so a step keeps nothing of the steps before it. The
    model's parameters require grad (nn marks them); before, every eager step's realized KV cache and token kept their
    autograd history, which held the step before: the live graph nodes grew with every token (SmolLM2: 14k nodes and
    8.5 MB a token). The mode is set around each step only: between tokens the caller's own mode holds."""
    import gc

    from fusegrad import storage
    from fusegrad.ir.ops import UOp
    from fusegrad.nn.state import get_parameters
    m = tiny()
    assert any(p.requires_grad for p in get_parameters(m))
    gen = Generator(m, jit=jit)
    gc.collect()
    histories = set(map(id, storage.lazy_of.keys()))   # (other tests' tensors that are still alive)
    live = []
    for i, _ in enumerate(gen.stream([1, 2, 3], 24)):
        assert Tensor.no_grad is False
        if i in (6, 22):
            gc.collect()
            live.append(sum(1 for o in gc.get_objects() if type(o) is UOp))
    assert set(map(id, storage.lazy_of.keys())) <= histories, "a generation's tensors recorded autograd history"
    # 16 tokens apart: eager, before, 5.8k more nodes (364 a token); now about 23 a token, the bound position's
    # index expressions that the (bounded) simplification caches keep per position
    assert live[1] - live[0] < 1000, live
