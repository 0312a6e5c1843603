"""QuantizedLinear (fusegrad/models/quantized.py): block planes split from bytes the gguf package quantizes, the
product equal to x @ dequantize(W).T (gguf.quants' NumPy dequantization) for Q4_0, Q4_1 and Q8_0, one kernel per call;
and Llama.from_gguf(quantized=True) giving the same logits and greedy tokens as the float32 path and transformers."""
from __future__ import annotations

import numpy as np
import pytest

from fusegrad import Tensor
from fusegrad.helpers import GlobalCounters
from fusegrad.models.quantized import QuantizedLinear, block_planes
from fusegrad.nn.state import load_state_dict

gguf = pytest.importorskip("gguf", reason="the blocks are quantized with the gguf package")


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("lead", [(1,), (1, 1), (2, 5)])
def test_product_equals_dequantized_matmul(name, lead):
    qt = gguf.GGMLQuantizationType[name]
    rng = np.random.default_rng(int(qt))
    O, I = 24, 96
    raw = gguf.quants.quantize(rng.standard_normal((O, I)).astype(np.float32), qt)
    w = gguf.quants.dequantize(raw, qt)
    lin = QuantizedLinear(I, O, int(qt))
    planes = block_planes(raw.tobytes(), int(qt), O, I)
    load_state_dict(lin, {k: Tensor(v) for k, v in planes.items()}, verbose=False)
    np.testing.assert_array_equal(lin.dequantize().numpy(), w)           # the planes hold exactly the file's values
    x = rng.standard_normal((*lead, I)).astype(np.float32)
    GlobalCounters.reset()
    got = lin(Tensor(x)).numpy()
    assert GlobalCounters.kernel_count == 1, "dequantization and product should be one kernel"
    np.testing.assert_allclose(got, x @ w.T, rtol=1e-5, atol=1e-5)


def test_bad_input():
    with pytest.raises(ValueError, match="no quantized kernel"): QuantizedLinear(32, 2, 12)
    with pytest.raises(ValueError, match="40 inputs are not whole Q8_0 blocks"): QuantizedLinear(40, 2, 8)
    with pytest.raises(ValueError, match="don't hold a"): block_planes(b"\0" * 33, 8, 1, 32)


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_0", "Q4_1"])
def test_llama_quantized_equals_float_path_and_transformers(tmp_path, quant):
    torch = pytest.importorskip("torch")
    from fusegrad.models.llama import Llama

    from .test_llama import PROMPTS, assert_logits, ref_greedy, tiny_llama, write_gguf
    held = write_gguf(tmp_path / "q.gguf", tiny_llama(), quant)
    ref = tiny_llama()
    ref.load_state_dict({k: torch.tensor(v) for k, v in held.items()})
    ours = Llama.from_gguf(tmp_path / "q.gguf", quantized=True)
    assert type(ours.model.layers[0].self_attn.q_proj).__name__ == "QuantizedLinear"
    flt = Llama.from_gguf(tmp_path / "q.gguf", quantized=False)
    for p in PROMPTS[:2]:
        np.testing.assert_allclose(ours.forward(Tensor([p]), 0).numpy(), flt.forward(Tensor([p]), 0).numpy(),
                                   rtol=1e-4, atol=1e-4)
    assert_logits(Llama.from_gguf(tmp_path / "q.gguf", quantized=True), ref, PROMPTS[:2])
    assert ours.generate(PROMPTS[0], 10) == ref_greedy(ref, PROMPTS[0], 10)
