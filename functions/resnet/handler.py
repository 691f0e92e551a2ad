"""resnet: image classification with torchvision's ResNet-152 (60.2 M parameters, 241 MB of float32 weights).

The weights are random from a fixed seed (RESNET_SEED, default 152): nothing is downloaded, and the same seed gives
the same model, and so the same answer, on every machine and GPU. The model is built and moved to the GPU when the
function starts (its initialisation, which the gpuserver captures as the function's model image); every request
runs one forward pass on whichever GPU the request is bound to.

Request, a JSON object with one input (default: a random image from seed 0):
  image    base64 of an encoded image (PNG, JPEG, anything Pillow reads, at most 8 MiB): resized so that its shorter
           side is 256, centre-cropped to 224x224 and normalised with the ImageNet mean and standard deviation
  pixels   one normalised image as a flat list of 3*224*224 numbers (channels, then rows), or a list of such lists
           (a batch)
  seed     an integer: a random normal image from this seed
  batch    1..16 copies of the input in one forward pass (default 1; not with a list of pixel lists)
  top_k    how many classes to answer per image, 1..20 (default 5)
  logits   true: also answer every logit (1000 per image)
Answer:
  {"model": "resnet152", "device": "cuda", "batch": 1, "input": "seed",
   "top_k": [[{"class": 409, "label": "analog clock", "logit": 3.2, "probability": 0.011}, ...]],   one list per image
   "logits_summary": {"shape": [1, 1000], "mean": ..., "std": ..., "min": ..., "max": ..., "nonfinite": 0},
   "logits": [[...]],   only with "logits": true
   "elapsed_ms": 14.2}   the forward pass, host to device and back included
A value that is not a finite number (NaN, infinity) is answered as null. Bad input is 400 naming the field.

Environment: RESNET_SEED; TORCH_DEVICE (default cuda for a GPU function, else cuda when available, else cpu).
"""

import base64
import binascii
import io
import json
import math
import os
import threading
import time

import torch
import torchvision

SEED = int(os.getenv("RESNET_SEED", "152"))
SIZE = 224
MAX_BATCH = 16
MAX_TOP_K = 20
MAX_IMAGE_BYTES = 8 << 20
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
CLASSES = 1000


def _device():
    wanted = os.getenv("TORCH_DEVICE", "")
    gpu_function = os.getenv("FAAS_GPU", "") in ("1", "true")
    if not wanted:
        wanted = "cuda" if gpu_function or torch.cuda.is_available() else "cpu"
    if wanted.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError("resnet: CUDA is not available (a GPU function reaches the GPU pool through faas-gpu's "
                           "libcuda.so.1 shim on LD_LIBRARY_PATH); set TORCH_DEVICE=cpu to run on the CPU")
    return torch.device(wanted)


def build_model(seed=SEED):
    """ResNet-152 with random weights from seed, in evaluation mode, on the CPU.

    Random weights leave batch normalisation's running statistics at mean 0 and variance 1, under which activations
    grow by orders of magnitude through the 50 blocks. One forward pass in training mode over a small random batch
    (from the same seed) sets every running statistic to that batch's (momentum None: a cumulative average), so that
    activations, logits and probabilities have ordinary magnitudes.
    """
    torch.manual_seed(seed)
    model = torchvision.models.resnet152(weights=None, num_classes=CLASSES)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.momentum = None
    calibration = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        model.train()
        model(calibration)
    return model.eval()


DEVICE = _device()
LABELS = torchvision.models.ResNet152_Weights.IMAGENET1K_V2.meta["categories"]  # shipped with torchvision
_lock = threading.Lock()
_model = build_model().to(DEVICE)


class BadRequest(Exception):
    pass


def _image(text):
    from PIL import Image, UnidentifiedImageError
    import torchvision.transforms.functional as F

    if not isinstance(text, str):
        raise BadRequest("image: must be a base64 string of an encoded image")
    if len(text) > (MAX_IMAGE_BYTES * 4) // 3 + 4:
        raise BadRequest("image: at most %d bytes of encoded image" % MAX_IMAGE_BYTES)
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise BadRequest("image: not base64: %s" % e)
    Image.MAX_IMAGE_PIXELS = 40_000_000
    try:
        img = Image.open(io.BytesIO(raw))
        img = img.convert("RGB")
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as e:
        raise BadRequest("image: cannot decode: %s" % e)
    t = F.to_tensor(F.center_crop(F.resize(img, 256), SIZE))
    return F.normalize(t, MEAN, STD).unsqueeze(0)


def _pixels(value):
    n = 3 * SIZE * SIZE
    rows = value if value and isinstance(value[0], list) else [value]
    if not rows or len(rows) > MAX_BATCH:
        raise BadRequest("pixels: one image or a list of 1..%d images" % MAX_BATCH)
    for i, row in enumerate(rows):
        if len(row) != n:
            raise BadRequest("pixels: image %d has %d values, want 3*%d*%d = %d" % (i, len(row), SIZE, SIZE, n))
    try:
        t = torch.tensor(rows, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError):
        raise BadRequest("pixels: must hold numbers only")
    return t.view(len(rows), 3, SIZE, SIZE), isinstance(value[0], list)


def _int(body, name, default, lo, hi):
    v = body.get(name, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise BadRequest("%s: must be an integer from %d to %d" % (name, lo, hi))
    return v


def parse(body):
    """(input batch on the CPU, input kind, top_k, whether to answer the logits) from a request object."""
    if not isinstance(body, dict):
        raise BadRequest("body: must be a JSON object")
    given = [k for k in ("image", "pixels", "seed") if k in body]
    if len(given) > 1:
        raise BadRequest("%s: give one input, not %s" % (given[1], " and ".join(given)))
    kind = given[0] if given else "seed"
    batch = _int(body, "batch", 1, 1, MAX_BATCH)
    top_k = _int(body, "top_k", 5, 1, MAX_TOP_K)
    want_logits = body.get("logits", False)
    if not isinstance(want_logits, bool):
        raise BadRequest("logits: must be true or false")
    if kind == "image":
        x = _image(body["image"])
    elif kind == "pixels":
        if not isinstance(body["pixels"], list):
            raise BadRequest("pixels: must be a list of numbers (or of lists of numbers)")
        x, many = _pixels(body["pixels"])
        if many and "batch" in body:
            raise BadRequest("batch: not with a list of images (the batch is the list)")
    else:
        seed = _int(body, "seed", 0, 0, 2**63 - 1)
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(1, 3, SIZE, SIZE, generator=g)
    if x.shape[0] == 1 and batch > 1:
        x = x.expand(batch, -1, -1, -1).contiguous()
    return x, kind, top_k, want_logits


def _num(v):
    v = float(v)
    return v if math.isfinite(v) else None


def summary(t):
    """Shape, mean, std, min, max over the finite values, and how many are not finite."""
    finite = torch.isfinite(t)
    vals = t[finite].double()
    out = {"shape": list(t.shape), "nonfinite": int((~finite).sum())}
    if vals.numel():
        out.update(mean=_num(vals.mean()), std=_num(vals.std(unbiased=False)), min=_num(vals.min()),
                   max=_num(vals.max()))
    return out


def forward(x):
    """Logits (batch x 1000, float32, on the CPU) of a CPU input batch."""
    with _lock, torch.inference_mode():
        return _model(x.to(DEVICE)).float().cpu()


def answer(x, kind, top_k, want_logits):
    started = time.perf_counter()
    logits = forward(x)
    elapsed = (time.perf_counter() - started) * 1000
    probs = torch.softmax(logits.double(), dim=1)
    ranked = torch.nan_to_num(logits, nan=-math.inf)
    top = []
    for i in range(logits.shape[0]):
        idx = torch.topk(ranked[i], top_k).indices.tolist()
        top.append([{"class": c, "label": LABELS[c], "logit": _num(logits[i, c]),
                     "probability": _num(probs[i, c])} for c in idx])
    out = {"model": "resnet152", "device": str(DEVICE), "batch": int(logits.shape[0]), "input": kind,
           "top_k": top, "logits_summary": summary(logits), "elapsed_ms": round(elapsed, 3)}
    if want_logits:
        out["logits"] = [[_num(v) for v in row] for row in logits.tolist()]
    return out


def handle(event, context):
    headers = {"Content-Type": "application/json"}
    try:
        body = json.loads(event.body or b"{}")
        x, kind, top_k, want_logits = parse(body)
    except ValueError as e:
        return {"statusCode": 400, "headers": headers, "body": {"error": "body: invalid JSON: %s" % e}}
    except BadRequest as e:
        return {"statusCode": 400, "headers": headers, "body": {"error": str(e)}}
    return {"statusCode": 200, "headers": headers, "body": answer(x, kind, top_k, want_logits)}
