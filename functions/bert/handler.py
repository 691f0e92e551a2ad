"""bert: a BERT-base encoder (transformers' BertModel: 12 layers, hidden size 768, 12 heads, 110 M parameters, 438 MB
of float32 weights) that answers the pooled embedding of its input.

The model is built from a BertConfig, not from a checkpoint: its weights are random from a fixed seed (BERT_SEED,
default 768), nothing is downloaded (HF_HUB_OFFLINE=1), and the same seed gives the same model on every machine and
GPU. Text goes through a built-in toy tokenizer, not BERT's WordPiece vocabulary (which would be a download): it
lowercases, splits words and punctuation, and maps each piece to an id in [1000, 30522) by a CRC-32 of its text,
between [CLS] (101) and [SEP] (102). The model is built and moved to the GPU when the function starts; every request
runs one forward pass on whichever GPU it is bound to.

Request, a JSON object with one input (default: random token ids from seed 0):
  text        a string, or a list of 1..32 strings (a batch; shorter ones are padded and masked)
  input_ids   token ids in [0, 30522), as one list or a list of 1..32 lists (used as given: no [CLS]/[SEP] added)
  seed        an integer: random token ids (seq_len of them, between [CLS] and [SEP]) from this seed
  seq_len     length of a random input, 2..512 (default 128)
  batch       1..32 copies of a single input in one forward pass (default 1; not with a list of inputs)
  embedding   true: also answer every pooled embedding (768 numbers per input)
Inputs longer than 512 tokens are refused.
Answer:
  {"model": "bert-base", "device": "cuda", "batch": 1, "seq_len": 9, "input": "text",
   "input_ids": [[101, ..., 102]],                                          for text and seed inputs
   "pooled": {"shape": [1, 768], "mean": ..., "std": ..., "min": ..., "max": ..., "nonfinite": 0,
              "norm": [...one L2 norm per input], "head": [...the first 8 values of the first input]},
   "last_hidden_state": {"shape": [1, 9, 768], "mean": ..., "std": ..., "min": ..., "max": ..., "nonfinite": 0},
   "embedding": [[...]],   only with "embedding": true
   "elapsed_ms": 7.9}      the forward pass, host to device and back included
A value that is not a finite number (NaN, infinity) is answered as null. Bad input is 400 naming the field.

Environment: BERT_SEED; TORCH_DEVICE (default cuda for a GPU function, else cuda when available, else cpu).
"""

import json
import math
import os
import re
import threading
import time
import zlib

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach a model hub: the model comes from a config
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

SEED = int(os.getenv("BERT_SEED", "768"))
VOCAB = 30522  # bert-base-uncased's vocabulary size
PAD, UNK, CLS, SEP = 0, 100, 101, 102
FIRST_WORD_ID = 1000
MAX_LEN = 512
MAX_BATCH = 32
MAX_TEXT = 64 << 10
HEAD = 8
_WORD = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def _device():
    wanted = os.getenv("TORCH_DEVICE", "")
    gpu_function = os.getenv("FAAS_GPU", "") in ("1", "true")
    if not wanted:
        wanted = "cuda" if gpu_function or torch.cuda.is_available() else "cpu"
    if wanted.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError("bert: CUDA is not available (a GPU function reaches the GPU pool through faas-gpu's "
                           "libcuda.so.1 shim on LD_LIBRARY_PATH); set TORCH_DEVICE=cpu to run on the CPU")
    return torch.device(wanted)


def build_model(seed=SEED):
    """BERT-base (bert-base-uncased's shape) with random weights from seed, in evaluation mode, on the CPU."""
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=768, num_hidden_layers=12,
                                     num_attention_heads=12, intermediate_size=3072, max_position_embeddings=MAX_LEN,
                                     pad_token_id=PAD)
    torch.manual_seed(seed)
    return transformers.BertModel(config, add_pooling_layer=True).eval()


def tokenize(text):
    """The toy tokenizer: [CLS], one id per lowercased word or punctuation mark (CRC-32 into the word ids), [SEP]."""
    ids = [CLS]
    for piece in _WORD.findall(text.lower()):
        ids.append(FIRST_WORD_ID + zlib.crc32(piece.encode()) % (VOCAB - FIRST_WORD_ID))
    ids.append(SEP)
    return ids


DEVICE = _device()
_lock = threading.Lock()
_model = build_model().to(DEVICE)


class BadRequest(Exception):
    pass


def _int(body, name, default, lo, hi):
    v = body.get(name, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise BadRequest("%s: must be an integer from %d to %d" % (name, lo, hi))
    return v


def _ids_list(name, value):
    if not isinstance(value, list) or not value:
        raise BadRequest("%s: must be a non-empty list of token ids" % name)
    if len(value) > MAX_LEN:
        raise BadRequest("%s: %d tokens, at most %d" % (name, len(value), MAX_LEN))
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < VOCAB:
            raise BadRequest("%s: token ids must be integers in [0, %d)" % (name, VOCAB))
    return value


def parse(body):
    """(list of token id lists, input kind, whether to answer the embeddings) from a request object."""
    if not isinstance(body, dict):
        raise BadRequest("body: must be a JSON object")
    given = [k for k in ("text", "input_ids", "seed") if k in body]
    if len(given) > 1:
        raise BadRequest("%s: give one input, not %s" % (given[1], " and ".join(given)))
    kind = given[0] if given else "seed"
    batch = _int(body, "batch", 1, 1, MAX_BATCH)
    want = body.get("embedding", False)
    if not isinstance(want, bool):
        raise BadRequest("embedding: must be true or false")
    many = False
    if kind == "text":
        text = body["text"]
        many = isinstance(text, list)
        texts = text if many else [text]
        if not texts or len(texts) > MAX_BATCH or not all(isinstance(t, str) for t in texts):
            raise BadRequest("text: must be a string or a list of 1..%d strings" % MAX_BATCH)
        if sum(len(t) for t in texts) > MAX_TEXT:
            raise BadRequest("text: at most %d characters in all" % MAX_TEXT)
        seqs = [tokenize(t) for t in texts]
        for i, s in enumerate(seqs):
            if len(s) > MAX_LEN:
                raise BadRequest("text: input %d is %d tokens, at most %d" % (i, len(s), MAX_LEN))
    elif kind == "input_ids":
        ids = body["input_ids"]
        many = isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)
        if many:
            if len(ids) > MAX_BATCH:
                raise BadRequest("input_ids: at most %d inputs" % MAX_BATCH)
            seqs = [_ids_list("input_ids[%d]" % i, s) for i, s in enumerate(ids)]
        else:
            seqs = [_ids_list("input_ids", ids)]
    else:
        seed = _int(body, "seed", 0, 0, 2**63 - 1)
        seq_len = _int(body, "seq_len", 128, 2, MAX_LEN)
        g = torch.Generator().manual_seed(seed)
        words = torch.randint(FIRST_WORD_ID, VOCAB, (seq_len - 2,), generator=g).tolist()
        seqs = [[CLS] + words + [SEP]]
    if "seq_len" in body and kind != "seed":
        raise BadRequest("seq_len: only with a seed input")
    if many and "batch" in body:
        raise BadRequest("batch: not with a list of inputs (the batch is the list)")
    if not many:
        seqs = seqs * batch
    return seqs, kind, want


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


def forward(seqs):
    """(pooled output batch x 768, last hidden state batch x len x 768), float32 on the CPU."""
    n = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), n), PAD, dtype=torch.long)
    mask = torch.zeros((len(seqs), n), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, :len(s)] = 1
    with _lock, torch.inference_mode():
        out = _model(input_ids=ids.to(DEVICE), attention_mask=mask.to(DEVICE))
        return out.pooler_output.float().cpu(), out.last_hidden_state.float().cpu()


def answer(seqs, kind, want):
    started = time.perf_counter()
    pooled, hidden = forward(seqs)
    elapsed = (time.perf_counter() - started) * 1000
    p = summary(pooled)
    p["norm"] = [_num(v) for v in torch.linalg.vector_norm(pooled.double(), dim=1).tolist()]
    p["head"] = [_num(v) for v in pooled[0, :HEAD].tolist()]
    out = {"model": "bert-base", "device": str(DEVICE), "batch": len(seqs), "seq_len": int(hidden.shape[1]),
           "input": kind, "pooled": p, "last_hidden_state": summary(hidden), "elapsed_ms": round(elapsed, 3)}
    if kind != "input_ids":
        out["input_ids"] = seqs
    if want:
        out["embedding"] = [[_num(v) for v in row] for row in pooled.tolist()]
    return out


def handle(event, context):
    headers = {"Content-Type": "application/json"}
    try:
        body = json.loads(event.body or b"{}")
        seqs, kind, want = parse(body)
    except ValueError as e:
        return {"statusCode": 400, "headers": headers, "body": {"error": "body: invalid JSON: %s" % e}}
    except BadRequest as e:
        return {"statusCode": 400, "headers": headers, "body": {"error": str(e)}}
    return {"statusCode": 200, "headers": headers, "body": answer(seqs, kind, want)}
