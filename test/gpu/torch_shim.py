"""Runs one forward-pass benchmark of an unchanged PyTorch model and prints a JSON result line.

Used by pytorch_test.go twice on the same machine: natively, and with faas-gpu's shim as libcuda.so.1 (the
environment decides which; this file does not know). Weights are random from a fixed seed, so both runs compute the
same function. Nothing is downloaded.

usage: python3 torch_shim.py resnet152|resnet50|bert-base ITERATIONS
"""

import json
import sys
import time

import torch


def build(name, batch=1):
    torch.manual_seed(0)
    if name in ("resnet152", "resnet50"):  # resnet50: the held-out model (docs/remoting-speed.md), in no trace
        import torchvision

        model = getattr(torchvision.models, name)(weights=None)
        x = torch.randn(batch, 3, 224, 224, generator=torch.Generator().manual_seed(1))
        return model, (x,)
    if name == "bert-base":
        try:
            from transformers import BertConfig, BertModel

            model = BertModel(BertConfig())  # bert-base-uncased's shape, random weights
            ids = torch.randint(0, 30522, (batch, 128), generator=torch.Generator().manual_seed(1))
            return model, (ids,)
        except ImportError:
            # BERT-base's encoder shape from torch alone: 12 layers, 768 wide, 12 heads, 3072 feed-forward.
            layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, batch_first=True, activation="gelu")
            model = torch.nn.TransformerEncoder(layer, 12)
            x = torch.randn(batch, 128, 768, generator=torch.Generator().manual_seed(1))
            return model, (x,)
    raise SystemExit("unknown model %r" % name)


def main():
    name, iterations = sys.argv[1], int(sys.argv[2])
    model, inputs = build(name)
    model = model.cuda().eval()
    inputs = tuple(t.cuda() for t in inputs)
    with torch.no_grad():
        for _ in range(5):
            out = model(*inputs)
        torch.cuda.synchronize()
        times = []
        for _ in range(iterations):
            start = time.perf_counter()
            out = model(*inputs)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    if not torch.is_tensor(out):
        out = out[0]
    flat = out.float().flatten().cpu()
    times.sort()
    print(json.dumps({
        "model": name,
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "p50_ms": 1000 * times[len(times) // 2],
        "output": flat[:4096].tolist(),
    }), flush=True)


if __name__ == "__main__":
    main()
