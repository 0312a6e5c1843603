"""Token generation for the decoder models (GPT-2, LLaMA): a prompt prefill run eagerly, then one-token decode steps
under TinyJit that read and write a KV cache at a symbolic position (a bound `Variable`), so one capture serves every
step. Consumes a model with `forward(tokens, start_pos) -> logits`; produces token ids."""
from __future__ import annotations

import contextlib
import time
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from fusegrad.device import Device
from fusegrad.dtype import dtypes
from fusegrad.engine.capture import JitError, capturing
from fusegrad.engine.jit import TinyJit
from fusegrad.ir.ops import UOp
from fusegrad.tensor import Tensor


class Decoder(Protocol):
    """What generate() needs from a model."""
    max_context: int
    def forward(self, tokens: Tensor, start_pos: int | UOp) -> Tensor: ...   # (B, T) -> logits (B, V) of the last token


class KVCache:
    """Keys and values of one attention layer for every position so far: two (B, H, L, D) buffers (each head's
    positions contiguous: a decode step reads them as one stream per head, which the prefetchers follow, where
    (B, L, H, D) strided through the cache), written at [start_pos, start_pos + T) and read as [0, start_pos + T).
    The capacity L grows with the context, in steps of `STEP` positions and at least doubling, up to `max_len`: a
    short generation with a long-context model holds only what it uses. L stays constant between growths, so a
    symbolic start_pos keeps the buffers' shapes constant and TinyJit replays one capture for every step; a growth
    counts in `allocations`, which tells Generator to capture again. (Slotted: get_state_dict doesn't see the caches.)

    >>> cache = KVCache(max_len=8)
    >>> keys, values = cache.update(Tensor.ones(1, 3, 2, 4), Tensor.ones(1, 3, 2, 4), start_pos=0)
    >>> keys.shape, cache.k.shape
    ((1, 3, 2, 4), (1, 2, 8, 4))
    """
    __slots__ = ("k", "max_len", "v", "_want")
    STEP = 256
    allocations = 0   # buffers allocated so far, by all caches: a TinyJit capture holding older buffers is stale

    def __init__(self, max_len: int):
        self.max_len = max_len
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self._want = 0   # positions reserved before the buffers exist

    @property
    def capacity(self) -> int:
        """Positions the buffers hold now (0 before the first update)."""
        return 0 if self.k is None else self.k.shape[2]

    def _steps(self, n: int) -> int:
        """Positions to allocate for n: a whole number of STEPs, at most max_len."""
        return min(self.max_len, -(-n // self.STEP) * self.STEP)

    def reserve(self, n: int) -> bool:
        """Make room for `n` positions (at most max_len), keeping what is stored; returns whether the buffers were
        reallocated. Before the first update (which knows the batch size and heads) it is remembered for that one."""
        if n > self.max_len: raise ValueError(f"{n} positions don't fit the KV cache's {self.max_len}")
        if self.k is None or self.v is None:
            self._want = max(self._want, n)
            return False
        if n <= self.capacity: return False
        if capturing:   # a replay would copy the old buffers over the new ones on every step
            raise JitError(f"the KV cache must grow to {n} positions inside a TinyJit capture; reserve them before the "
                           "jitted step (KVCache.reserve, Generator.reserve)")
        B, H, L, D = self.k.shape
        size = max(self._steps(n), min(self.max_len, 2 * self.capacity))   # (at least doubling)
        k, v = Tensor.zeros(B, H, size, D, dtype=self.k.dtype).contiguous(), \
            Tensor.zeros(B, H, size, D, dtype=self.v.dtype).contiguous()
        k[:, :, :L] = self.k
        v[:, :, :L] = self.v
        self.k, self.v = k.realize(), v.realize()
        KVCache.allocations += 1
        return True

    def update(self, k: Tensor, v: Tensor, start_pos: int | UOp) -> tuple[Tensor, Tensor]:
        """Store k, v (B, T, H, D) at start_pos; returns all keys and values so far, (B, start_pos + T, H, D)."""
        B, T, H, D = k.shape
        end = (start_pos if isinstance(start_pos, int) else start_pos.unbind()[1]) + T
        if self.k is None or self.k.shape[0] != B or (self.k.shape[1], self.k.shape[3]) != (H, D):
            size = self._steps(max(end, self._want, 1))
            self.k = Tensor.zeros(B, H, size, D, dtype=k.dtype).contiguous().realize()
            self.v = Tensor.zeros(B, H, size, D, dtype=v.dtype).contiguous().realize()
            KVCache.allocations += 1
        elif end > self.capacity: self.reserve(end)
        assert self.k is not None and self.v is not None
        self.k[:, :, start_pos:start_pos + T] = k.permute(0, 2, 1, 3)
        self.v[:, :, start_pos:start_pos + T] = v.permute(0, 2, 1, 3)
        return self.k[:, :, :start_pos + T].permute(0, 2, 1, 3), self.v[:, :, :start_pos + T].permute(0, 2, 1, 3)


def causal_mask(T: int, start_pos: int) -> Tensor | None:
    """The additive mask (1, 1, T, start_pos + T) that lets query i see keys 0..start_pos + i; None for one query
    (a decode step sees every cached key)."""
    if T == 1: return None
    m = np.triu(np.full((T, start_pos + T), -np.inf, dtype=np.float32), k=start_pos + 1)
    return Tensor(m.reshape(1, 1, T, start_pos + T))


@dataclass(frozen=True)
class Sampling:
    """How each next token is picked, as transformers' logits processors do it, in this order: repetition penalty
    (a logit of a token already in the prompt or the output is divided by it when positive, multiplied when
    negative), temperature (0: greedy), top-k (keep the k largest; 0: all), top-p (keep the most likely tokens
    whose probabilities add up to top_p; 1: all); then a draw from a NumPy generator seeded with `seed`.

    >>> probs = Sampling(temperature=1.0, top_k=2).probabilities(np.array([1.0, 3.0, 2.0, 0.0]), history=[])
    >>> [round(float(p), 3) for p in probs]
    [0.0, 0.731, 0.269, 0.0]
    """
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= 0: raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0: raise ValueError(f"top_k must be >= 0 (0: no limit), got {self.top_k}")
        if not 0 < self.top_p <= 1: raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")

    @property
    def on_device(self) -> bool:
        """Plain greedy decoding: the argmax runs inside the decode step, no logits come back to the host."""
        return self.temperature == 0 and self.repetition_penalty == 1

    def penalized(self, logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        """Logits (V,) float32 after the repetition penalty."""
        out = np.array(logits, dtype=np.float32)
        if self.repetition_penalty != 1 and len(history):
            seen = np.unique(np.asarray(history, dtype=np.int64))
            v, r = out[seen], np.float32(self.repetition_penalty)
            out[seen] = np.where(v < 0, v * r, v / r)
        return out

    def probabilities(self, logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        """The distribution (V,) float64 the next token is drawn from (temperature > 0)."""
        x = self.penalized(logits, history) / np.float32(self.temperature)
        if 0 < self.top_k < x.size:
            kth = np.partition(x, -self.top_k)[-self.top_k]
            x = np.where(x < kth, -np.inf, x)
        if self.top_p < 1:
            order = np.argsort(x, kind="stable")                                 # ascending, as transformers
            p = np.exp(x[order] - x[order[-1]])
            cum = np.cumsum(p / p.sum())
            drop = cum <= 1 - self.top_p
            drop[-1] = False                                                     # always keep the most likely
            x = x.copy()
            x[order[drop]] = -np.inf
        p = np.exp(x.astype(np.float64) - x.max())
        return p / p.sum()

    def pick(self, logits: np.ndarray, history: Sequence[int], rng: np.random.Generator) -> int:
        """The next token from logits (V,)."""
        if self.temperature == 0: return int(np.argmax(self.penalized(logits, history)))
        probs = self.probabilities(logits, history)
        return int(rng.choice(probs.size, p=probs))


@dataclass
class Generation:
    """The tokens generate() produced and how long it took."""
    tokens: list[int]
    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_steps: int = 0
    times: list[float] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        """Decode speed (tokens after the first, which comes out of the prefill)."""
        return self.decode_steps / self.decode_s if self.decode_s else float("nan")

    @property
    def steady_tokens_per_s(self) -> float:
        """Decode speed after the first two decode steps (TinyJit's plain run and its capture, which compile)."""
        rest = self.times[3:]
        return len(rest) / sum(rest) if rest and sum(rest) else float("nan")


@contextlib.contextmanager
def inference() -> Iterator[None]:
    """Tensor.no_grad inside the block (then the mode it was): generation builds its graphs without autograd, as
    torch's generate runs under no_grad. A model's parameters require grad (nn's layers mark them), so without it
    every realized KV cache and token kept its autograd history, and each eager step's history held the one before:
    SmolLM2 with jit=False grew by 8.5 MB and 14k graph nodes a token. (Set around each step only, never across a
    yield: the caller's code between tokens runs in its own mode.)"""
    prev, Tensor.no_grad = Tensor.no_grad, True
    try: yield
    finally: Tensor.no_grad = prev


def release_prefill_buffers(*outputs: Tensor) -> None:
    """After a prefill (its outputs computed): give the memory of its freed intermediates back (the allocator keeps
    freed buffers for reuse, but a prompt of another length asks for other sizes, and the decode steps for much
    smaller ones): SmolLM2-135M, 82 tokens, 23 MB."""
    Tensor.realize(*outputs)
    for d in {t.device for t in outputs if isinstance(t.device, str)}: Device[d].allocator.free_cache()


def kv_caches(model: Any) -> list[KVCache]:
    """The KV caches a model holds, found by walking its attributes, lists and dicts (each once)."""
    out: list[KVCache] = []
    seen: set[int] = set()
    todo = [model]
    while todo:
        o = todo.pop()
        if id(o) in seen or isinstance(o, (Tensor, str, bytes, int, float, np.ndarray, type, types.ModuleType)) or \
                callable(o) and not hasattr(o, "__dict__"): continue
        seen.add(id(o))
        if isinstance(o, KVCache): out.append(o)
        elif isinstance(o, dict): todo.extend(o.values())
        elif isinstance(o, (list, tuple)): todo.extend(o)
        elif hasattr(o, "__dict__"): todo.extend(vars(o).values())
    return out


class Generator:
    """Runs a Decoder: `generate(prompt_ids, max_new)` greedy (temperature 0) or sampled. Decode steps run under
    TinyJit with `start_pos` a bound Variable (one capture for all positions); jit=False runs them eagerly.
    (Slotted, so get_state_dict of a model holding one doesn't walk into the jits' tensors.)

    >>> from fusegrad.models.gpt2 import GPT2, GPT2Config
    >>> model = GPT2(GPT2Config(vocab_size=11, n_positions=8, n_embd=8, n_layer=1, n_head=2))
    >>> len(Generator(model).generate([1, 2], max_new=3).tokens)
    3
    """
    __slots__ = ("_caches", "_caches_seen", "_greedy", "_logits", "_sample", "jit", "model", "start_pos")

    def __init__(self, model: Decoder, jit: bool = True):
        self.model, self.jit = model, jit
        self.start_pos = UOp.variable("start_pos", 1, model.max_context - 1)
        self._greedy = TinyJit(self._greedy_step)
        self._sample = TinyJit(self._sample_step)
        self._logits = TinyJit(self._logits_step)
        self._caches_seen = -1
        self._caches = kv_caches(model)

    def reserve(self, n: int) -> None:
        """Make every KV cache of the model hold `n` positions before the steps that need them run (they can't grow
        inside a TinyJit replay), and capture the steps again if that reallocated one."""
        for c in self._caches: c.reserve(n)
        self._recapture_if_new_caches()

    def _greedy_step(self, tok: Tensor, pos: Any) -> Tensor:
        return self.model.forward(tok, pos).argmax(-1).cast(dtypes.int32).reshape(-1, 1).realize()   # (B, 1)

    def _sample_step(self, tok: Tensor, pos: Any, temperature: Tensor) -> Tensor:
        probs = (self.model.forward(tok, pos) / temperature).softmax(-1)
        return probs.multinomial(1).cast(dtypes.int32).realize()                                    # (B, 1)

    def _logits_step(self, tok: Tensor, pos: Any) -> Tensor:
        return self.model.forward(tok, pos).realize()                                               # (B, V)

    def _recapture_if_new_caches(self) -> None:
        """After a prefill: if it allocated new KV-cache buffers (another batch size ran), the decode steps' captures
        hold the old ones, so they capture again."""
        if KVCache.allocations != self._caches_seen:
            self._greedy.reset()
            self._sample.reset()
            self._logits.reset()
            self._caches_seen = KVCache.allocations

    def check_length(self, n_prompt: int, max_new: int) -> None:
        """ValueError when the prompt, or the prompt plus the new tokens, doesn't fit the context."""
        ctx = self.model.max_context
        if n_prompt == 0: raise ValueError("the prompt is empty: give at least one token")
        if n_prompt > ctx:
            raise ValueError(f"the prompt has {n_prompt} tokens, longer than the model's context of {ctx} tokens; "
                             "shorten it")
        if n_prompt + max_new > ctx:
            raise ValueError(f"the prompt ({n_prompt} tokens) plus {max_new} new tokens is longer than the model's "
                             f"context of {ctx} tokens; ask for at most {ctx - n_prompt} new tokens")

    def stream(self, prompt: Sequence[int], max_new: int, temperature: float = 0.0,
               stop: Callable[[int], bool] | None = None, sampling: Sampling | None = None) -> Iterator[int]:
        """Yield new token ids one by one (stop after `max_new`, or when stop(token) is true). With `sampling`
        (top-k, top-p, repetition penalty, a seed) the logits come back to the host and Sampling picks each token;
        otherwise `temperature` 0 is greedy and > 0 samples on the device."""
        self.check_length(len(prompt), max_new)
        if temperature < 0: raise ValueError(f"temperature must be >= 0, got {temperature}")
        if max_new <= 0: return
        host = sampling is not None and not sampling.on_device
        with inference():
            self.reserve(len(prompt) + max_new)
            logits = self.model.forward(Tensor([list(prompt)], dtype=dtypes.int32), 0)       # prefill: (1, V)
            if host:
                tok = logits
            elif temperature == 0: tok = logits.argmax(-1).cast(dtypes.int32).reshape(1, 1)
            else: tok = (logits / temperature).softmax(-1).multinomial(1).cast(dtypes.int32)
            temp = Tensor([temperature]).realize()
            self._recapture_if_new_caches()
            release_prefill_buffers(logits, tok)
        history, rng = list(prompt), np.random.default_rng(sampling.seed if sampling is not None else None)
        for i in range(max_new):
            if host:
                assert sampling is not None
                t = sampling.pick(tok.numpy()[0], history, rng)
                history.append(t)
            else: t = int(tok.item())
            yield t
            if i == max_new - 1 or (stop is not None and stop(t)): return
            pos = self.start_pos.bind(len(prompt) + i)
            with inference():
                if host:
                    tok = (self._logits if self.jit else self._logits_step)(Tensor([[t]], dtype=dtypes.int32), pos)
                elif temperature == 0: tok = (self._greedy if self.jit else self._greedy_step)(tok.contiguous(), pos)
                else: tok = (self._sample if self.jit else self._sample_step)(tok.contiguous(), pos, temp)

    @inference()   # (a function, not a generator: the whole call)
    def generate_batch(self, prompts: Sequence[Sequence[int]], max_new: int, temperature: float = 0.0,
                       stop: Callable[[int], bool] | None = None, sampling: Sampling | None = None) -> list[list[int]]:
        """New token ids for several prompts at once, one row of a batch each (up to `max_new` per prompt; a row
        ends early where stop(token) is true). Prompts may differ in length, with no padding and no mask: the common
        prefix (as long as the shortest prompt) is prefilled as one (B, T) batch, then every step feeds each row its
        next token at the same position, which is the row's own next prompt token until that prompt is used up and
        then the token the row generated. So each row sees exactly what a batch of one would (greedy: the same
        tokens as `generate` of that prompt alone); rows whose prompts are longer generate later. Greedy and on-device
        sampling (`temperature`) draw in the decode step; `sampling` picks on the host, each row with its own history
        (and one NumPy generator for the batch, seeded by `sampling.seed`)."""
        if not prompts: return []
        lens = [len(p) for p in prompts]
        for p in prompts: self.check_length(len(p), max_new)
        if temperature < 0: raise ValueError(f"temperature must be >= 0, got {temperature}")
        if max_new <= 0: return [[] for _ in prompts]
        B, start = len(prompts), min(lens)
        host = sampling is not None and not sampling.on_device
        rng = np.random.default_rng(sampling.seed if sampling is not None else None)
        out: list[list[int]] = [[] for _ in prompts]
        done = [False] * B
        self.reserve(min(max(lens) + max_new, self.model.max_context))
        logits = self.model.forward(Tensor([list(p[:start]) for p in prompts], dtype=dtypes.int32), 0)   # (B, V)
        self._recapture_if_new_caches()
        release_prefill_buffers(logits)
        temp = Tensor([temperature]).realize()
        pos_now = start   # the position whose token each row feeds next
        while True:
            if host:
                assert sampling is not None
                rows = logits.numpy()
                picked = [sampling.pick(rows[b], list(prompts[b]) + out[b], rng) if pos_now >= lens[b] else -1
                          for b in range(B)]
            else:
                if temperature == 0: picked = logits.argmax(-1).numpy().reshape(-1).tolist()
                else: picked = (logits / temp).softmax(-1).multinomial(1).numpy().reshape(-1).tolist()
            feed = []
            for b in range(B):
                if pos_now < lens[b]: feed.append(prompts[b][pos_now])   # still reading its prompt
                else:
                    t = int(picked[b])
                    if not done[b]:
                        out[b].append(t)
                        done[b] = len(out[b]) >= max_new or (stop is not None and stop(t))
                    feed.append(t)
            if all(done) or pos_now >= self.model.max_context: return out
            pos = self.start_pos.bind(pos_now)
            tok = Tensor([[t] for t in feed], dtype=dtypes.int32)
            logits = (self._logits if self.jit else self._logits_step)(tok, pos)
            pos_now += 1

    def generate(self, prompt: Sequence[int], max_new: int, temperature: float = 0.0,
                 stop: Callable[[int], bool] | None = None, sampling: Sampling | None = None) -> Generation:
        """All new tokens at once, with the prefill and per-token decode times."""
        out = Generation([])
        start = time.perf_counter()
        for t in self.stream(prompt, max_new, temperature, stop, sampling):
            now = time.perf_counter()
            out.times.append(now - start)
            out.tokens.append(t)
            start = now
        if out.times:
            out.prefill_s, out.decode_steps = out.times[0], len(out.times) - 1
            out.decode_s = sum(out.times[1:])
        return out


__all__ = ["Decoder", "Generation", "Generator", "KVCache", "Sampling", "causal_mask", "inference", "kv_caches"]
