"""llm: a decoder-only transformer behind an OpenAI-compatible API (completions and chat completions, streamed as
server-sent events with "stream": true).

The model is transformers' Qwen2ForCausalLM with Qwen2.5-0.5B's shape (24 layers, hidden size 896, 14 query and 2
key/value heads, MLP 4864, RoPE theta 1e6, bfloat16) and this function's own byte-level BPE vocabulary of 8,192
tokens (tokenizer.json, trained with the pinned tokenizers; train_tokenizer.py): 0.36 B parameters in the blocks
and 7.3 M in the embedding, which the output head shares (tied, as Qwen2.5-0.5B's; its 151,936-token vocabulary
accounts for 0.14 B of its 0.49 B). The weights are random from a fixed seed (LLM_SEED), built on the CPU and moved
to the GPU when the function starts: nothing is downloaded, and the same seed gives the same bytes on every machine.

With LLM_MODEL_DIR the function serves a Hugging Face model directory instead (README.md: "Your own model"): a
decoder-only model of a family of FAMILIES (Qwen2, Llama, Mistral) from its safetensors, with its own tokenizer.json,
chat template and end-of-sequence ids, under the directory's name; a relative path is this file's directory's (the
build context). The directory is checked before PyTorch is imported and loaded strictly (no tensor missing,
unexpected or of another shape); a bad one ends the process with one line naming the path (SystemExit), which the
provider's status shows.

A variant of the base carries a LoRA adapter (LLM_ADAPTER_SEED; none by default): a low-rank update of rank
LLM_ADAPTER_RANK (8) of the query and value projections of every layer (PEFT's default targets for Qwen2, with
alpha = rank), W x + B (A x), unmerged, random from its seed: 0.54 M parameters, 1.1 MB in bfloat16. The base's
weights are the same bytes in every variant and come first in the device buffer; the adapter's start at a 2 MiB
chunk of their own, so that variants share every chunk of the base (com.openfaas.gpu.model: shared).

Decoding is a loop of this file, one token per step, with a static KV cache: greedy (temperature 0) takes the
argmax on the GPU, sampling copies the step's logits to the host and draws there from a generator seeded by the
request's seed (so no GPU random state is used, and the same seed gives the same tokens everywhere). The loop
stops on the host: after max_tokens, at <|endoftext|> or <|im_end|> (unless ignore_eos), or at a stop string. With
LLM_CUDA_GRAPHS=1 the decode step (embedding to argmax, the KV cache and positions at fixed addresses) is captured
once with torch.cuda.graph and replayed; if capture fails, the function logs why and decodes eagerly.

The KV cache is allocated by the first request, not at start, so it is scratch, not part of the model image; with
com.openfaas.gpu.scratch: request (stack.yml) its memory is the request's: given back when the request ends and
mapped again, zeroed, for the next, so every request writes what it reads (README.md beside this file: sizing the
quota).

Request (POST /v1/completions), OpenAI's fields:
  prompt            a string (or a list of one string, or a list of token ids); at most LLM_MAX_PROMPT_TOKENS tokens
  max_tokens        1..LLM_MAX_TOKENS (default 16)
  temperature       0..2 (default 1; 0 is greedy)
  top_p             (0, 1] (default 1)
  seed              an integer: the sampler's seed (default 0)
  stream            true: server-sent events, one per token, then data: [DONE]
  stream_options    {"include_usage": true}: a last event with the usage
  stop              a string or a list of up to 4: the text ends before the first one generated
  n                 1 only
  model             optional; if given, the name this function serves (GET /v1/models)
  ignore_eos        true: do not stop at <|endoftext|> / <|im_end|> (vLLM's extension)
  return_token_ids  true: each choice also carries token_ids, and the answer prompt_token_ids (vLLM's extension)
POST /v1/chat/completions takes messages (a list of 1..64 {"role": "system"|"developer"|"user"|"assistant",
"content": text}), formatted as <|im_start|>role\\ncontent<|im_end|>\\n and ending with <|im_start|>assistant\\n
(with LLM_MODEL_DIR: by the model's chat template),
instead of prompt, and max_completion_tokens as another name of max_tokens. Bad input is 400 with OpenAI's error
object naming the field ("param").
Answer: OpenAI's text_completion / chat.completion objects (chunks when streaming), with usage, and "faas_gpu":
{"ttft_ms", "decode_tokens_per_s", "cuda_graphs"} measured in the function.

With LLM_KV_CACHE=paged the KV cache is blocks of LLM_KV_BLOCK_TOKENS tokens allocated as the sequence grows and
freed when it ends (KVBlocks); a request that cannot get one (LLM_KV_MAX_BLOCKS, or out of memory in the quota) is
answered 429; GET /metrics shows the blocks.

With LLM_MAX_BATCH > 1 concurrent requests are decoded together (continuous batching: batching.py schedules,
BatchEngine runs the model): each step decodes one token of every active sequence in one forward pass, new requests
are prefilled (together, up to LLM_PREFILL_TOKENS padded prompt tokens per pass) and join at step boundaries, finished ones and those whose client went away leave, first come first
served, at most LLM_MAX_BATCH at once. Their KV cache is paged blocks of one device pool that grows on demand and is
freed when no sequence is active; with LLM_KV_MAX_BLOCKS a sequence reserves what its prompt and max_tokens can
need when it joins (one that never fits is answered 429, others wait). CONCURRENCY tells the gpu-python template to
let that many requests in at once under one GPU binding. Greedy tokens are those of the request decoded alone.

Environment: LLM_MODEL_DIR (none: the random model), LLM_MAX_BATCH (1), LLM_KV_CACHE (static; paged with
LLM_MAX_BATCH > 1), LLM_PREFILL_TOKENS (2048), LLM_KV_BLOCK_TOKENS (64),
LLM_KV_MAX_BLOCKS (0: no limit but the quota), LLM_SEED (500), LLM_ADAPTER_SEED (none), LLM_ADAPTER_RANK
(8), LLM_LAYERS (24), LLM_HIDDEN (896), LLM_HEADS (14), LLM_KV_HEADS (2), LLM_INTERMEDIATE (4864), LLM_DTYPE
(bfloat16, float16 or float32; a model directory's own by default), LLM_MAX_PROMPT_TOKENS (1024), LLM_MAX_TOKENS
(512), LLM_CUDA_GRAPHS (0), LLM_MODEL_NAME (faas-gpu-llm-0.5b, or the model directory's name), TORCH_DEVICE (cuda
for a GPU function).
"""

import json
import math
import os
import sys
import threading
import time
import uuid

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach a model hub: the model comes from a config
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# The decoder-only families whose loading through this file is tested (test/cuda: TestLLMOwnModel*).
FAMILIES = ("qwen2", "llama", "mistral")


class ModelDirError(Exception):
    """A model directory that cannot be served; its message names the directory."""


def _safetensors_ok(path):
    """Reads a safetensors file's header (8-byte little-endian length, then JSON) and checks that the file holds
    every tensor's bytes; returns the tensors' names. Raises ModelDirError."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if not 2 <= n <= min(size - 8, 100 << 20):
                raise ModelDirError("%s: not a safetensors file (header length %d, file %d bytes)" % (path, n, size))
            header = json.loads(f.read(n))
    except OSError as e:
        raise ModelDirError("%s: %s" % (path, e.strerror or e))
    except ValueError as e:
        raise ModelDirError("%s: not a safetensors file (its header is not JSON: %s)" % (path, e))
    if not isinstance(header, dict):
        raise ModelDirError("%s: not a safetensors file (its header is not a JSON object)" % path)
    end = 0
    for name, t in header.items():
        if name == "__metadata__":
            continue
        try:
            end = max(end, int(t["data_offsets"][1]))
        except (TypeError, KeyError, IndexError, ValueError):
            raise ModelDirError("%s: not a safetensors file (tensor %r has no data_offsets)" % (path, name))
    if 8 + n + end > size:
        raise ModelDirError("%s: truncated: its tensors need %d bytes, the file has %d" % (path, 8 + n + end, size))
    return [k for k in header if k != "__metadata__"]


def check_model_dir(path):
    """Checks a Hugging Face model directory before PyTorch is imported, so that a bad one is one clear line (the
    function's last, which the provider's status shows) and not a traceback from deep inside transformers: the
    directory, config.json of a supported family, safetensors weights whole on disk, the model's tokenizer.json.
    Returns the parsed config.json. Raises ModelDirError naming the path."""
    where = "LLM_MODEL_DIR=%s" % path
    if not os.path.isdir(path):
        raise ModelDirError("%s: %s" % (where, "not a directory" if os.path.exists(path) else "no such directory"))
    cfg_path = os.path.join(path, "config.json")
    try:
        with open(cfg_path) as f:
            config = json.load(f)
    except FileNotFoundError:
        raise ModelDirError("%s: no config.json (a Hugging Face model directory, as save_pretrained writes it: "
                            "config.json, model.safetensors, tokenizer.json)" % where)
    except (OSError, ValueError) as e:
        raise ModelDirError("%s: config.json is not readable JSON: %s" % (where, e))
    if not isinstance(config, dict):
        raise ModelDirError("%s: config.json is not a JSON object" % where)
    family = config.get("model_type")
    if family not in FAMILIES:
        raise ModelDirError("%s: config.json's model_type %r is not supported (supported: %s)" %
                            (where, family, ", ".join(FAMILIES)))
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        try:
            with open(index) as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ModelDirError("%s: model.safetensors.index.json has no readable weight_map: %s" % (where, e))
        files = [os.path.join(path, s) for s in shards]
        for f in files:
            if not os.path.isfile(f):
                raise ModelDirError("%s: model.safetensors.index.json names %s, which is missing" % (where, f))
    elif os.path.isfile(os.path.join(path, "model.safetensors")):
        files = [os.path.join(path, "model.safetensors")]
    else:
        other = [f for f in ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.bin") if
                 os.path.exists(os.path.join(path, f))]
        raise ModelDirError("%s: no safetensors weights (model.safetensors or model.safetensors.index.json)%s" %
                            (where, "; found %s: only safetensors are loaded (convert with save_pretrained)" %
                             other[0] if other else ""))
    names = []
    for f in files:
        try:
            names += _safetensors_ok(f)
        except ModelDirError as e:
            raise ModelDirError("%s: %s" % (where, e))
    if not names:
        raise ModelDirError("%s: the safetensors files hold no tensors" % where)
    if not os.path.isfile(os.path.join(path, "tokenizer.json")):
        raise ModelDirError("%s: no tokenizer.json (the model's fast tokenizer, as its tokenizer's save_pretrained "
                            "writes it)" % where)
    return config


# A model directory to serve instead of the random model; a relative path is the handler's directory's (the
# function's build context: functions/llm/<model>/ beside handler.py).
MODEL_DIR = os.getenv("LLM_MODEL_DIR", "")
if MODEL_DIR:
    MODEL_DIR = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), MODEL_DIR))
    try:
        MODEL_CONFIG = check_model_dir(MODEL_DIR)
    except ModelDirError as e:
        raise SystemExit("llm: %s" % e)

import torch  # noqa: E402
import transformers  # noqa: E402

try:  # the gpu-python template imports this file as function.handler, the tests as handler
    from . import batching  # noqa: E402
except ImportError:
    import batching  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def _env_int(name, default, lo=1, hi=1 << 20):
    try:
        v = int(os.getenv(name, str(default)))
    except ValueError:
        raise SystemExit("llm: %s must be an integer" % name)
    if not lo <= v <= hi:
        raise SystemExit("llm: %s must be from %d to %d" % (name, lo, hi))
    return v


SEED = _env_int("LLM_SEED", 500, 0, 2**31 - 1)
ADAPTER_SEED = _env_int("LLM_ADAPTER_SEED", 0, 0, 2**31 - 1) if os.getenv("LLM_ADAPTER_SEED", "") else None
ADAPTER_RANK = _env_int("LLM_ADAPTER_RANK", 8, 1, 256)
LAYERS = _env_int("LLM_LAYERS", 24, 1, 128)
HIDDEN = _env_int("LLM_HIDDEN", 896, 64, 16384)
HEADS = _env_int("LLM_HEADS", 14, 1, 256)
KV_HEADS = _env_int("LLM_KV_HEADS", 2, 1, 256)
INTERMEDIATE = _env_int("LLM_INTERMEDIATE", 4864, 64, 65536)
MAX_PROMPT = _env_int("LLM_MAX_PROMPT_TOKENS", 1024, 1, 32768)
MAX_TOKENS = _env_int("LLM_MAX_TOKENS", 512, 1, 32768)
CONTEXT = MAX_PROMPT + MAX_TOKENS  # the static KV cache's length
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
# A model directory's own dtype (config.json's dtype or torch_dtype) unless LLM_DTYPE says otherwise.
_dtype_default = "bfloat16"
if MODEL_DIR:
    _dtype_default = MODEL_CONFIG.get("dtype") or MODEL_CONFIG.get("torch_dtype") or "bfloat16"
    if _dtype_default not in DTYPES:
        _dtype_default = "bfloat16"
DTYPE = DTYPES.get(os.getenv("LLM_DTYPE", "") or _dtype_default)
if DTYPE is None:
    raise SystemExit("llm: LLM_DTYPE must be bfloat16, float16 or float32")
GRAPHS = os.getenv("LLM_CUDA_GRAPHS", "0") in ("1", "true")
# The KV cache: "static" (one block of LLM_MAX_PROMPT_TOKENS + LLM_MAX_TOKENS tokens, allocated by the first
# request) or "paged" (blocks of LLM_KV_BLOCK_TOKENS tokens allocated as a sequence grows and freed when it ends).
# Continuous batching: up to LLM_MAX_BATCH concurrent requests decode together, one token each per step (1: each
# request decodes alone, one at a time). It takes the paged KV cache (each sequence holds blocks of its own).
MAX_BATCH = _env_int("LLM_MAX_BATCH", 1, 1, 1024)
KV_CACHE = os.getenv("LLM_KV_CACHE", "") or ("paged" if MAX_BATCH > 1 else "static")
if KV_CACHE not in ("static", "paged"):
    raise SystemExit("llm: LLM_KV_CACHE must be static or paged")
if MAX_BATCH > 1 and KV_CACHE != "paged":
    raise SystemExit("llm: LLM_MAX_BATCH > 1 batches sequences in the paged KV cache: LLM_KV_CACHE=static takes "
                     "LLM_MAX_BATCH=1")
if MAX_BATCH > 1 and GRAPHS:
    raise SystemExit("llm: LLM_MAX_BATCH > 1 decodes eagerly (a batch's shapes change every step): "
                     "LLM_CUDA_GRAPHS=1 takes LLM_MAX_BATCH=1")
# The gpu-python template reads CONCURRENCY: requests it lets in at once in this process, all under one GPU binding
# (FAAS_GPU_CONCURRENCY overrides it); beyond them requests wait for a slot.
CONCURRENCY = MAX_BATCH
if KV_CACHE == "paged" and GRAPHS:
    raise SystemExit("llm: LLM_KV_CACHE=paged decodes eagerly: a captured graph needs the cache at fixed addresses "
                     "(LLM_CUDA_GRAPHS=1 takes LLM_KV_CACHE=static)")
KV_BLOCK = _env_int("LLM_KV_BLOCK_TOKENS", 64, 1, 4096)
KV_MAX_BLOCKS = _env_int("LLM_KV_MAX_BLOCKS", 0, 0, 1 << 20)  # 0: as many as the quota allows
# With batching, the most prompt tokens (rows x the longest prompt, padded) prefilled in one pass.
PREFILL_TOKENS = _env_int("LLM_PREFILL_TOKENS", 2048, 1, 1 << 20)
# The served name: LLM_MODEL_NAME, else a model directory's name (Qwen2.5-0.5B-Instruct for .../Qwen2.5-0.5B-Instruct).
MODEL_NAME = os.getenv("LLM_MODEL_NAME", "") or (os.path.basename(MODEL_DIR) if MODEL_DIR else "faas-gpu-llm-0.5b")
MAX_TEXT = 256 << 10  # characters of prompt text, before tokenizing
MAX_MESSAGES = 64
EOT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"


def _device():
    wanted = os.getenv("TORCH_DEVICE", "")
    gpu_function = os.getenv("FAAS_GPU", "") in ("1", "true")
    if not wanted:
        wanted = "cuda" if gpu_function or torch.cuda.is_available() else "cpu"
    if wanted.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError("llm: CUDA is not available (a GPU function reaches the GPU pool through faas-gpu's "
                           "libcuda.so.1 shim on LD_LIBRARY_PATH); set TORCH_DEVICE=cpu to run on the CPU")
    return torch.device(wanted)


def load_tokenizer():
    if MODEL_DIR:
        try:
            return transformers.AutoTokenizer.from_pretrained(MODEL_DIR, local_files_only=True)
        except Exception as e:  # noqa: BLE001 - whatever transformers raises, the function cannot start
            raise SystemExit("llm: LLM_MODEL_DIR=%s: loading its tokenizer failed: %s: %s" %
                             (MODEL_DIR, type(e).__name__, str(e).replace("\n", " ")))
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=os.path.join(HERE, "tokenizer.json"),
                                               eos_token=EOT, additional_special_tokens=[IM_START, IM_END])
    return tok


def _ids_of(v):
    """A config's token id field (an int, a list of them, or None) as a set."""
    if v is None:
        return set()
    if isinstance(v, int):
        return {v}
    return {i for i in v if isinstance(i, int)}


def load_model_dir(path, tokenizer):
    """The model of a Hugging Face model directory on the CPU in evaluation mode, in DTYPE, and its stop token ids
    (generation_config.json's, config.json's and the tokenizer's end of sequence). Every weight must come from the
    files: a tensor missing, unexpected or of another shape is an error, never a randomly initialised layer.
    Raises SystemExit naming the path."""
    where = "LLM_MODEL_DIR=%s" % path
    try:
        config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as e:  # noqa: BLE001
        raise SystemExit("llm: %s: config.json: %s: %s" % (where, type(e).__name__, str(e).replace("\n", " ")))
    limit = getattr(config, "max_position_embeddings", None)
    if limit is not None and CONTEXT > limit:
        raise SystemExit("llm: %s: LLM_MAX_PROMPT_TOKENS + LLM_MAX_TOKENS = %d exceeds the model's "
                         "max_position_embeddings (%d)" % (where, CONTEXT, limit))
    # A sliding window longer than the context never slides: attention is then exactly full (the decode loop's
    # masks are full causal ones). A shorter one is refused rather than served with the wrong attention.
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    slides = window is not None and (types is None or "sliding_attention" in types)
    if slides and window < CONTEXT:
        raise SystemExit("llm: %s: the model's sliding window (%d tokens) is shorter than LLM_MAX_PROMPT_TOKENS + "
                         "LLM_MAX_TOKENS = %d; sliding-window attention is not supported: lower them to at most "
                         "the window" % (where, window, CONTEXT))
    if window is not None:
        config.sliding_window = None
        if types is not None:
            config.layer_types = ["full_attention"] * len(types)
    config._attn_implementation = "sdpa"
    try:
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            path, config=config, dtype=DTYPE, local_files_only=True, use_safetensors=True,
            output_loading_info=True)
    except Exception as e:  # noqa: BLE001
        raise SystemExit("llm: %s: loading the weights failed: %s: %s" %
                         (where, type(e).__name__, str(e).replace("\n", " ")))
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        bad = sorted(str(k) for k in (info.get(kind) or ()))
        if bad:
            raise SystemExit("llm: %s: the weights do not match config.json (%s: %s%s)" %
                             (where, kind.replace("_", " "), ", ".join(bad[:4]), ", ..." if len(bad) > 4 else ""))
    stop = _ids_of(config.eos_token_id) | _ids_of(tokenizer.eos_token_id)
    gen_path = os.path.join(path, "generation_config.json")
    if os.path.exists(gen_path):
        try:
            with open(gen_path) as f:
                stop |= _ids_of(json.load(f).get("eos_token_id"))
        except (OSError, ValueError, AttributeError) as e:
            raise SystemExit("llm: %s: generation_config.json: %s" % (where, e))
    return model.eval(), stop


class LoRALinear(torch.nn.Module):
    """A linear layer with a LoRA adapter, unmerged: base(x) + B (A x) (alpha = rank: scale 1). The base layer's
    weights stay the base's bytes; A (rank x in) and B (out x rank) are the variant's own."""

    def __init__(self, base, rank, gen):
        super().__init__()
        self.base = base
        a = torch.randn((rank, base.in_features), generator=gen) / math.sqrt(base.in_features)
        self.lora_A = torch.nn.Parameter(a, requires_grad=False)
        self.lora_B = torch.nn.Parameter(torch.randn((base.out_features, rank), generator=gen) * 0.02,
                                         requires_grad=False)

    def forward(self, x):
        return self.base(x) + torch.nn.functional.linear(torch.nn.functional.linear(x, self.lora_A), self.lora_B)


def build_model(vocab, seed=SEED, adapter_seed=ADAPTER_SEED, rank=ADAPTER_RANK):
    """The model on the CPU, weights random from seed, with a LoRA adapter random from adapter_seed (None: none),
    in evaluation mode."""
    config = transformers.Qwen2Config(
        vocab_size=vocab, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS, intermediate_size=INTERMEDIATE, max_position_embeddings=max(CONTEXT, 32768),
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
        bos_token_id=0, eos_token_id=0, pad_token_id=0)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(config)
    # The weights from a generator of our own, in a fixed order (normal, std 0.02; norms 1), so that the bytes do
    # not depend on how transformers initialises (the tied head is the embedding: named once).
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    if model.lm_head.weight is not model.model.embed_tokens.weight:
        raise RuntimeError("llm: the output head is not tied to the embedding")
    if adapter_seed is not None:
        ga = torch.Generator().manual_seed(adapter_seed)
        for layer in model.model.layers:
            attn = layer.self_attn
            attn.q_proj = LoRALinear(attn.q_proj, rank, ga)
            attn.v_proj = LoRALinear(attn.v_proj, rank, ga)
    return model.to(DTYPE).eval()


def adapter_parameters(model):
    """The parameters of the model's LoRA adapter (none without one)."""
    return [p for m in model.modules() if isinstance(m, LoRALinear) for p in (m.lora_A, m.lora_B)]


CHUNK = 2 << 20  # the GPUs' mapping granularity: the unit in which identical weights are shared


def to_device_packed(model, device):
    """Moves every parameter and buffer of model into one device buffer, in a fixed order, each at a 256-byte
    aligned offset, the buffer a whole number of 2 MiB chunks: the base's tensors first, then, from a chunk
    boundary, the adapter's. A tensor held by two modules (the tied head) is placed once and stays shared. Nothing
    else is ever allocated in the buffer (it is one block of the caching allocator, used up to its end), so the
    function never writes its model memory after initialisation (com.openfaas.gpu.model: shared), and variants of
    one base hold identical chunks but for their adapter's."""
    if device.type != "cuda":
        return model.to(device)
    adapter = {id(p) for p in adapter_parameters(model)}
    refs, tensors = [], {}  # (module, kind, name, id) per reference; id -> tensor, in first-seen order
    for module in model.modules():
        for kind in ("_parameters", "_buffers"):
            for name, t in getattr(module, kind).items():
                if t is not None:
                    refs.append((module, kind, name, id(t)))
                    tensors.setdefault(id(t), t)
    offsets, total = {}, 0
    for own in (False, True):
        if own:
            total = (total + CHUNK - 1) // CHUNK * CHUNK
        for key, t in tensors.items():
            if (key in adapter) == own:
                offsets[key] = total
                total += (t.numel() * t.element_size() + 255) // 256 * 256
    flat = torch.empty((total + CHUNK - 1) // CHUNK * CHUNK, dtype=torch.uint8, device=device)
    moved = {}
    with torch.no_grad():
        for key, t in tensors.items():
            off = offsets[key]
            view = flat[off:off + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
            view.copy_(t)
            moved[key] = torch.nn.Parameter(view, requires_grad=False) if isinstance(t, torch.nn.Parameter) else view
        for module, kind, name, key in refs:
            getattr(module, kind)[name] = moved[key]
    return model


def _trim_host_memory():
    """Gives the host memory of the model's build on the CPU back to the system: freed, it stays in the C
    allocator's heap otherwise (hundreds of MB per process)."""
    import ctypes
    import gc
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


class BadRequest(Exception):
    def __init__(self, param, message, status=400):
        super().__init__(message)
        self.param = param
        self.message = message
        self.status = status


KVExhausted = batching.KVExhausted  # no KV block could be had: answered 429


class KVBlocks:
    """The function's paged KV cache: blocks of KV_BLOCK tokens, each one device tensor holding every layer's keys
    and values for those tokens ([layers, 2, 1, kv heads, KV_BLOCK, head dim], zeroed), allocated as the sequence
    grows and freed (back to the quota: the caching allocator's cache is emptied) when it ends. Counters for
    /metrics."""

    def __init__(self, config, dtype, device):
        heads = config.num_key_value_heads
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.shape = (config.num_hidden_layers, 2, 1, heads, KV_BLOCK, dim)
        self.dtype, self.device = dtype, device
        self.block_bytes = math.prod(self.shape) * torch.empty((), dtype=dtype).element_size()
        self.blocks = []
        self.peak = 0
        self.allocated_total = 0
        self.freed_total = 0
        self.refused_total = 0

    def capacity(self):
        return len(self.blocks) * KV_BLOCK

    def ensure(self, tokens):
        """Allocates blocks until tokens fit; raises KVExhausted."""
        while self.capacity() < tokens:
            if KV_MAX_BLOCKS and len(self.blocks) >= KV_MAX_BLOCKS:
                self.refused_total += 1
                raise KVExhausted("the KV cache is full: %d blocks of %d tokens in use (LLM_KV_MAX_BLOCKS)" %
                                  (len(self.blocks), KV_BLOCK))
            try:
                self.blocks.append(torch.zeros(self.shape, dtype=self.dtype, device=self.device))
            except torch.OutOfMemoryError as e:
                self.refused_total += 1
                raise KVExhausted("no GPU memory left in the function's quota for a KV block of %d bytes (%d "
                                  "blocks in use): %s" % (self.block_bytes, len(self.blocks), e))
            self.allocated_total += 1
            self.peak = max(self.peak, len(self.blocks))

    def free(self):
        self.freed_total += len(self.blocks)
        self.blocks = []
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


class PagedLayer(transformers.cache_utils.CacheLayerMixin):
    """One layer's view of KVBlocks for transformers' attention: update() writes the new keys and values into their
    blocks and answers the blocks' keys and values concatenated (the capacity's length; the decode loop's mask
    hides the positions not written yet)."""

    is_compileable = False
    is_sliding = False

    def __init__(self, index, pool):
        super().__init__()
        self.index, self.pool, self.length = index, pool, 0
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states):
        pass

    def update(self, key_states, value_states, *args, **kwargs):
        n = key_states.shape[-2]
        self.pool.ensure(self.length + n)
        done = 0
        while done < n:
            at = self.length + done
            b, off = divmod(at, KV_BLOCK)
            m = min(n - done, KV_BLOCK - off)
            blk = self.pool.blocks[b]
            blk[self.index, 0, :, :, off:off + m].copy_(key_states[:, :, done:done + m])
            blk[self.index, 1, :, :, off:off + m].copy_(value_states[:, :, done:done + m])
            done += m
        self.length += n
        blocks = self.pool.blocks
        return (torch.cat([blk[self.index, 0] for blk in blocks], dim=2),
                torch.cat([blk[self.index, 1] for blk in blocks], dim=2))

    def get_mask_sizes(self, query_length):
        return self.pool.capacity(), 0

    def get_seq_length(self):
        return self.length

    def get_max_length(self):
        return self.pool.capacity()

    def reset(self):
        self.length = 0


class Decoder:
    """The model on its device with a static KV cache and, with graphs, the captured decode step. Used under
    _lock by one generation at a time."""

    def __init__(self, model, device):
        self.model = model
        self.device = device
        self.cache = None  # allocated by the first request: scratch, not part of the model image
        self.graph = None
        self.graph_error = None
        self.graph_tried = False

    def _ensure_cache(self):
        if self.cache is not None:
            return
        d = self.device
        self.cache = transformers.StaticCache(config=self.model.config, max_cache_len=CONTEXT)
        self.positions = torch.arange(CONTEXT, device=d)
        self.tok = torch.zeros((1, 1), dtype=torch.long, device=d)   # the step's input token
        self.pos = torch.zeros((1,), dtype=torch.long, device=d)     # the step's position
        self.next = torch.zeros((1, 1), dtype=torch.long, device=d)  # the step's greedy choice
        self.logits = torch.zeros((1, self.model.config.vocab_size), dtype=torch.float32, device=d)

    def _forward(self, ids, position_ids, mask):
        # Only the last position's logits: a prefill of n tokens would otherwise make n x vocabulary of them
        # (1,024 x 151,936 in bfloat16 is 311 MB for a Qwen2.5's vocabulary), counted against the quota.
        out = self.model(input_ids=ids, position_ids=position_ids, attention_mask=mask,
                         past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :].float()

    def _step(self):
        """One decode step on the static buffers: the token at self.pos, its logits, the greedy next token, and
        the position advanced; no host synchronisation (it is what a graph captures)."""
        mask = (self.positions <= self.pos).view(1, 1, 1, CONTEXT)
        self.logits.copy_(self._forward(self.tok, self.pos.view(1, 1), mask))
        self.next.copy_(torch.argmax(self.logits, dim=-1, keepdim=True))
        self.tok.copy_(self.next)
        self.pos.add_(1)

    def _capture(self):
        """Captures _step once (warm-up on a side stream first, as torch.cuda.graph needs). A failure leaves the
        function decoding eagerly; its reason is logged and answered in faas_gpu.cuda_graph_error."""
        self.graph_tried = True
        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            # The warm-up steps advance the positions and the cache layers' lengths: put them back after.
            state = [self.pos, self.tok] + [layer.cumulative_length for layer in self.cache.layers]
            saved = [t.clone() for t in state]
            with torch.cuda.stream(s):
                for _ in range(2):
                    self._step()
            torch.cuda.current_stream().wait_stream(s)
            for t, v in zip(state, saved):
                t.copy_(v)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                self._step()
            for t, v in zip(state, saved):
                t.copy_(v)
            self.graph = g
            print("llm: decode step captured as a CUDA graph", file=sys.stderr, flush=True)
        except Exception as e:  # noqa: BLE001 - any failure means: decode eagerly
            self.graph_error = "%s: %s" % (type(e).__name__, e)
            print("llm: CUDA graph capture failed, decoding eagerly: %s" % self.graph_error, file=sys.stderr, flush=True)

    def _ensure_paged(self):
        if self.cache is not None:
            return
        d = self.device
        self.kv = KVBlocks(self.model.config, DTYPE, d)
        self.cache = transformers.Cache(layers=[PagedLayer(i, self.kv) for i in
                                                range(self.model.config.num_hidden_layers)])
        self.positions = torch.arange(CONTEXT, device=d)
        self.tok = torch.zeros((1, 1), dtype=torch.long, device=d)
        self.pos = torch.zeros((1,), dtype=torch.long, device=d)
        self.next = torch.zeros((1, 1), dtype=torch.long, device=d)
        self.logits = torch.zeros((1, self.model.config.vocab_size), dtype=torch.float32, device=d)

    def _prefill_paged(self, ids):
        self._ensure_paged()
        torch.arange(CONTEXT, out=self.positions)
        self.cache.reset()
        n = len(ids)
        self.kv.ensure(n)  # the blocks first: the mask spans their capacity
        self.host_pos = n
        cap = self.kv.capacity()
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        mask = (self.positions[:cap].view(1, cap) <= self.positions[:n].view(n, 1)).view(1, 1, n, cap)
        self.logits.copy_(self._forward(x, self.positions[:n].view(1, n), mask))
        self.next.copy_(torch.argmax(self.logits, dim=-1, keepdim=True))
        self.tok.copy_(self.next)
        self.pos.fill_(n)

    def _step_paged(self):
        self.kv.ensure(self.host_pos + 1)
        cap = self.kv.capacity()
        mask = (self.positions[:cap] <= self.pos).view(1, 1, 1, cap)
        self.logits.copy_(self._forward(self.tok, self.pos.view(1, 1), mask))
        self.next.copy_(torch.argmax(self.logits, dim=-1, keepdim=True))
        self.tok.copy_(self.next)
        self.pos.add_(1)
        self.host_pos += 1

    def end(self):
        """The sequence ended: its KV blocks go back (paged; the static cache stays)."""
        if KV_CACHE == "paged" and self.cache is not None:
            self.kv.free()
            self.cache.reset()

    def prefill(self, ids):
        """Runs the prompt, leaving its last token's logits in self.logits, the greedy choice in self.next and
        self.tok, and the next position in self.pos."""
        if KV_CACHE == "paged":
            return self._prefill_paged(ids)
        self._ensure_cache()
        # Everything the request allocated may come back zeroed at the next (com.openfaas.gpu.scratch: request
        # gives the scratch back between requests): the positions, the cache and its lengths are written afresh.
        torch.arange(CONTEXT, out=self.positions)
        self.cache.reset()
        n = len(ids)
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        mask = (self.positions.view(1, CONTEXT) <= self.positions[:n].view(n, 1)).view(1, 1, n, CONTEXT)
        self.logits.copy_(self._forward(x, self.positions[:n].view(1, n), mask))
        self.next.copy_(torch.argmax(self.logits, dim=-1, keepdim=True))
        self.tok.copy_(self.next)
        self.pos.fill_(n)

    def step(self, token=None):
        """Decodes one step from the token in self.tok (or token, set first)."""
        if token is not None:
            self.tok.fill_(token)
        if KV_CACHE == "paged":
            return self._step_paged()
        if self.device.type == "cuda" and GRAPHS and not self.graph_tried:
            self._capture()
        if GRAPHS and self.graph is not None:
            self.graph.replay()
        else:
            self._step()


class BatchLayer(transformers.cache_utils.CacheLayerMixin):
    """One layer's view of the BatchEngine's KV pool for transformers' attention: update() writes the step's keys
    and values at their sequences' positions (one indexed write each) and answers every sequence's blocks gathered
    in order ([batch, kv heads, blocks x block tokens, head dim]; the mask hides what a sequence has not written)."""

    is_compileable = False
    is_sliding = False

    def __init__(self, index, engine):
        super().__init__()
        self.index, self.engine = index, engine
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states):
        pass

    def update(self, key_states, value_states, *args, **kwargs):
        e = self.engine
        b, heads, q, dim = key_states.shape
        keys, values = e.pool[:, self.index, 0], e.pool[:, self.index, 1]  # [slots, block tokens, heads, dim]
        keys[e.write_block, e.write_offset] = key_states.transpose(1, 2).reshape(b * q, heads, dim)
        values[e.write_block, e.write_offset] = value_states.transpose(1, 2).reshape(b * q, heads, dim)
        length = e.table.shape[1] * KV_BLOCK
        return (keys[e.table].reshape(b, length, heads, dim).transpose(1, 2),
                values[e.table].reshape(b, length, heads, dim).transpose(1, 2))

    def get_mask_sizes(self, query_length):
        return self.engine.table.shape[1] * KV_BLOCK, 0

    def get_seq_length(self):
        return 0

    def get_max_length(self):
        return -1

    def reset(self):
        pass


class BatchEngine:
    """The GPU side of continuous batching (batching.py's engine): the model with a KV pool of KV_BLOCK-token
    blocks in one device tensor ([slots, layers, keys and values, block tokens, kv heads, head dim], zeroed), which
    grows on demand (copied into one twice as large) and is freed when no sequence is active. A step is one forward
    pass of the model over its sequences: a prefill the prompts of the sequences joining (left-padded to the
    longest), a decode step every active sequence's last token at its own position; the token indices, positions, block tables and write slots of a step go to the
    device in one copy, and the greedy choices come back in one. Sampled sequences copy their logits' rows to the
    host and draw there (sample(), seeded by the request's seed)."""

    def __init__(self, model, device):
        self.model, self.device = model, device
        c = model.config
        heads = c.num_key_value_heads
        dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.slot_shape = (c.num_hidden_layers, 2, KV_BLOCK, heads, dim)
        self.block_bytes = math.prod(self.slot_shape) * torch.empty((), dtype=DTYPE).element_size()
        self.pool = None
        self.cache = transformers.Cache(layers=[BatchLayer(i, self) for i in range(c.num_hidden_layers)])

    def grow(self, capacity):
        """The pool holds capacity blocks (0: freed, back to the quota), and one slot more that takes the writes of
        a prefill's padding; raises KVExhausted without memory."""
        old = self.pool
        if capacity == 0:
            self.pool = None
        else:
            try:
                pool = torch.zeros((capacity + 1,) + self.slot_shape, dtype=DTYPE, device=self.device)
            except torch.OutOfMemoryError as e:
                raise KVExhausted("no GPU memory left in the function's quota for %d KV blocks of %d bytes: %s" %
                                  (capacity, self.block_bytes, e))
            if old is not None:
                pool[:old.shape[0] - 1].copy_(old[:-1])
            self.pool = pool
        del old
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _forward(self, rows):
        """One forward pass: rows are (sequence, its tokens to run, the position of the first), left-padded to the
        longest (a pad is token 0 at position 0, its keys and values written to the pool's last slot and never
        read); answers the last position's logits per row ([rows, vocabulary], float32)."""
        q = max(len(toks) for _, toks, _ in rows)
        nblk = max(len(s.blocks) for s, _, _ in rows)
        trash = self.pool.shape[0] - 1
        host = []
        for s, toks, start in rows:  # tokens, positions, block table, write slots and offsets: one copy
            pad = q - len(toks)
            pos = range(start, start + len(toks))
            host += [0] * pad + toks
            host += [0] * pad + list(pos)
            host += s.blocks + [s.blocks[0]] * (nblk - len(s.blocks))
            host += [trash] * pad + [s.blocks[p // KV_BLOCK] for p in pos]
            host += [0] * pad + [p % KV_BLOCK for p in pos]
        b = len(rows)
        dev = torch.tensor(host, dtype=torch.long).to(self.device).view(b, 4 * q + nblk)
        ids, positions = dev[:, :q], dev[:, q:2 * q]
        self.table = dev[:, 2 * q:2 * q + nblk]
        self.write_block = dev[:, 2 * q + nblk:3 * q + nblk].reshape(-1)
        self.write_offset = dev[:, 3 * q + nblk:].reshape(-1)
        length = nblk * KV_BLOCK
        mask = (torch.arange(length, device=self.device).view(1, 1, length) <= positions.view(b, q, 1)).view(
            b, 1, q, length)
        out = self.model(input_ids=ids, position_ids=positions, attention_mask=mask, past_key_values=self.cache,
                         use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :].float()

    def _choose(self, seqs, logits):
        toks = torch.argmax(logits, dim=-1).tolist()  # one read back
        for i, s in enumerate(seqs):
            if s.sample is not None:
                temperature, top_p, gen = s.sample
                toks[i] = sample(logits[i].cpu(), temperature, top_p, gen)
        return toks

    @torch.inference_mode()
    def prefill(self, seqs):
        return self._choose(seqs, self._forward([(s, s.prompt, 0) for s in seqs]))

    @torch.inference_mode()
    def decode(self, seqs):
        return self._choose(seqs, self._forward([(s, [s.last()], s.length) for s in seqs]))


def sample(logits, temperature, top_p, gen):
    """A token drawn on the host from logits (float32, on the host) at temperature with nucleus top_p."""
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < top_p
        sorted_p = sorted_p * keep
        return int(order[torch.multinomial(sorted_p / sorted_p.sum(), 1, generator=gen)])
    return int(torch.multinomial(probs, 1, generator=gen))


DEVICE = _device()
if DEVICE.type == "cuda":
    torch.backends.cuda.enable_cudnn_sdp(False)  # cuDNN attention compiles a kernel per new shape
_lock = threading.Lock()
TOKENIZER = load_tokenizer()
if MODEL_DIR:
    if ADAPTER_SEED is not None:
        raise SystemExit("llm: LLM_ADAPTER_SEED is for the random model; LLM_MODEL_DIR=%s is served as it is" %
                         MODEL_DIR)
    _cpu_model, STOP_IDS = load_model_dir(MODEL_DIR, TOKENIZER)
    VOCAB = _cpu_model.config.vocab_size  # the embedding's rows (may exceed the tokenizer's, padded)
    # The model's own chat template (tokenizer_config.json or chat_template.jinja); without one, chat is refused.
    CHAT_TEMPLATE = bool(getattr(TOKENIZER, "chat_template", None))
    # Completions add what the tokenizer adds (a Llama's <s>), as transformers' and vLLM's do; a chat template
    # writes its own.
    ADD_SPECIAL = True
else:
    VOCAB = len(TOKENIZER)
    STOP_IDS = {TOKENIZER.convert_tokens_to_ids(EOT), TOKENIZER.convert_tokens_to_ids(IM_END)}
    _cpu_model = build_model(VOCAB)
    CHAT_TEMPLATE = False
    ADD_SPECIAL = False
_model = to_device_packed(_cpu_model, DEVICE)
del _cpu_model
if DEVICE.type == "cuda":
    _trim_host_memory()
DECODER = Decoder(_model, DEVICE)
BATCHER = None
if MAX_BATCH > 1:
    _engine = BatchEngine(_model, DEVICE)
    BATCHER = batching.Batcher(_engine, batching.Blocks(KV_BLOCK, KV_MAX_BLOCKS, _engine.grow), MAX_BATCH,
                               PREFILL_TOKENS)


# ---- requests


def _int(body, name, default, lo, hi):
    v = body.get(name, default)
    if v is None:
        v = default
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise BadRequest(name, "%s: must be an integer from %d to %d" % (name, lo, hi))
    return v


def _num(body, name, default, lo, hi, lo_open=False):
    v = body.get(name, default)
    if v is None:
        v = default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi or \
            (lo_open and v == lo):
        raise BadRequest(name, "%s: must be a number in %s%s, %s]" % (name, "(" if lo_open else "[", lo, hi))
    return float(v)


def _bool(body, name):
    v = body.get(name, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise BadRequest(name, "%s: must be true or false" % name)
    return v


def _unsupported(body, name, allowed):
    v = body.get(name)
    if v is not None and v not in allowed:
        raise BadRequest(name, "%s: %r is not supported by this function (only %s)" %
                         (name, v, " or ".join(repr(a) for a in allowed if a is not None) or "null"))


def _text(name, v):
    if not isinstance(v, str):
        raise BadRequest(name, "%s: must be a string" % name)
    if len(v) > MAX_TEXT:
        raise BadRequest(name, "%s: %d characters, at most %d" % (name, len(v), MAX_TEXT))
    return v


def _content(i, m):
    c = m.get("content")
    if isinstance(c, list):  # [{"type": "text", "text": ...}]
        parts = []
        for j, p in enumerate(c):
            if not isinstance(p, dict) or p.get("type") != "text":
                raise BadRequest("messages", "messages[%d].content[%d]: only text parts are supported" % (i, j))
            parts.append(_text("messages", p.get("text")))
        return "".join(parts)
    if c is None:
        return ""
    return _text("messages", c)


def parse(body, chat):
    """The request as (prompt token ids, options); raises BadRequest naming the field."""
    if not isinstance(body, dict):
        raise BadRequest(None, "body: must be a JSON object")
    model = body.get("model")
    if model is not None and model != MODEL_NAME:
        raise BadRequest("model", "model: %r is not served here (this function serves %r)" % (model, MODEL_NAME),
                         404)
    _unsupported(body, "n", (None, 1))
    _unsupported(body, "best_of", (None, 1))
    _unsupported(body, "echo", (None, False))
    _unsupported(body, "presence_penalty", (None, 0, 0.0))
    _unsupported(body, "frequency_penalty", (None, 0, 0.0))
    _unsupported(body, "logprobs", (None, False) if chat else (None,))
    if body.get("logit_bias"):
        raise BadRequest("logit_bias", "logit_bias: is not supported by this function")
    if chat and body.get("tools"):
        raise BadRequest("tools", "tools: are not supported by this function")
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not 1 <= len(msgs) <= MAX_MESSAGES:
            raise BadRequest("messages", "messages: must be a list of 1 to %d messages" % MAX_MESSAGES)
        text, conv = [], []
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant"):
                raise BadRequest("messages", "messages[%d]: must be an object with role system, developer, user or "
                                 "assistant" % i)
            text.append("%s%s\n%s%s\n" % (IM_START, m["role"], _content(i, m), IM_END))
            # OpenAI's developer role is the system role of the models' own templates.
            conv.append({"role": "system" if m["role"] == "developer" else m["role"], "content": _content(i, m)})
        text.append(IM_START + "assistant\n")
        joined = "".join(text)
        if MODEL_DIR:
            if not CHAT_TEMPLATE:
                raise BadRequest("messages", "messages: the model %s has no chat template (its tokenizer_config.json "
                                 "or chat_template.jinja): use /v1/completions" % MODEL_NAME)
            try:
                joined = TOKENIZER.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
            except Exception as e:  # noqa: BLE001 - a template's raise_exception (e.g. roles must alternate)
                raise BadRequest("messages", "messages: the model's chat template refused them: %s" % e)
        if len(joined) > MAX_TEXT:
            raise BadRequest("messages", "messages: %d characters, at most %d" % (len(joined), MAX_TEXT))
        ids = TOKENIZER.encode(joined, add_special_tokens=False)
        where = "messages"
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = TOKENIZER.encode(_text("prompt", prompt), add_special_tokens=ADD_SPECIAL)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                         for t in prompt):
            if len(prompt) > MAX_PROMPT:
                raise BadRequest("prompt", "prompt: %d tokens, at most %d" % (len(prompt), MAX_PROMPT))
            if any(not 0 <= t < VOCAB for t in prompt):
                raise BadRequest("prompt", "prompt: token ids must be in [0, %d)" % VOCAB)
            ids = list(prompt)
        else:
            raise BadRequest("prompt", "prompt: must be a string, a list of one string, or a list of token ids")
        where = "prompt"
    if not ids:
        raise BadRequest(where, "%s: is empty after tokenizing" % where)
    if len(ids) > MAX_PROMPT:
        raise BadRequest(where, "%s: %d tokens, at most %d (LLM_MAX_PROMPT_TOKENS)" % (where, len(ids), MAX_PROMPT))
    name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _int(body, name, 16, 1, MAX_TOKENS)
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is None:
        stop = []
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and 0 < len(s) <= 256
                                                              for s in stop):
        raise BadRequest("stop", "stop: must be a string or a list of up to 4 non-empty strings of at most 256 "
                         "characters")
    so = body.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise BadRequest("stream_options", "stream_options: must be an object")
    opts = {
        "chat": chat,
        "max_tokens": max_tokens,
        "temperature": _num(body, "temperature", 1.0, 0.0, 2.0),
        "top_p": _num(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        "seed": _int(body, "seed", 0, -(2**63), 2**63 - 1),
        "stream": _bool(body, "stream"),
        "include_usage": bool(so and so.get("include_usage")),
        "stop": stop,
        "ignore_eos": _bool(body, "ignore_eos"),
        "return_token_ids": _bool(body, "return_token_ids"),
    }
    return ids, opts


class Generation:
    """One request's tokens as they are decoded, with their text: run() yields (text delta, token id) per token
    (and the held-back rest of the text with token None at the end) and ends with self.finish set to "length" or
    "stop". With LLM_MAX_BATCH > 1 its tokens come from the Batcher (decoded together with the other requests'),
    else from the Decoder, alone under _lock."""

    def __init__(self, ids, opts):
        self.ids = ids
        self.opts = opts
        self.tokens = []
        self.text = ""
        self.finish = None
        self.ttft = None
        self.decode_s = 0.0
        self.emitted = 0  # characters of self.text yielded
        o = opts
        self.gen = torch.Generator().manual_seed(o["seed"] % (2**63))
        self.seq = None
        if BATCHER is not None:
            self.seq = batching.Sequence(ids, o["max_tokens"], () if o["ignore_eos"] else STOP_IDS,
                                         None if o["temperature"] == 0.0 else (o["temperature"], o["top_p"], self.gen))

    def check(self):
        """Raises KVExhausted if the sequence can never get its blocks (before a stream's first byte)."""
        if BATCHER is not None:
            BATCHER.check(self.seq)

    def run(self):
        o = self.opts
        held = max((len(s) for s in o["stop"]), default=1) - 1  # characters that may start a stop string
        t0 = time.perf_counter()
        if BATCHER is not None:
            BATCHER.submit(self.seq)
            toks = BATCHER.tokens(self.seq)
            try:
                yield from self._text(toks, o, held, t0)
            finally:  # a stop string or the client going away: the sequence leaves the batch, its blocks go back
                toks.close()
            self.finish = self.finish or self.seq.finish or "length"
        else:
            with _lock, torch.inference_mode():
                d = DECODER
                try:
                    yield from self._text(self._solo(d, o), o, held, t0)
                finally:  # also when the client went away (the generator closed): the sequence's KV blocks go back
                    d.end()
            self.finish = self.finish or "length"
        if len(self.text) > self.emitted:
            yield self.text[self.emitted:], None

    def _solo(self, d, o):
        """The sequence's tokens decoded alone; a stop token ends it (self.finish "stop") and is not yielded."""
        greedy = o["temperature"] == 0.0
        d.prefill(self.ids)
        for i in range(o["max_tokens"]):  # the length stop: decided on the host, whatever the device computes
            if i > 0:
                d.step(None if greedy else tok)
            if greedy:
                tok = int(d.next.item())
            else:
                tok = sample(d.logits[0].cpu(), o["temperature"], o["top_p"], self.gen)
            if tok in STOP_IDS and not o["ignore_eos"]:
                self.finish = "stop"
                return
            yield tok

    def _text(self, tokens, o, held, t0):
        emitted = 0
        try:
            for i, tok in enumerate(tokens):
                now = time.perf_counter()
                if i == 0:
                    self.ttft = now - t0
                    t1 = now
                else:
                    self.decode_s = now - t1
                self.tokens.append(tok)
                text = TOKENIZER.decode(self.tokens, skip_special_tokens=True)
                cut = min((text.find(s) for s in o["stop"] if s in text), default=-1)
                if cut >= 0:
                    self.text = text[:cut]
                    self.finish = "stop"
                    break
                self.text = text
                # One event per token; its text may be empty: an incomplete UTF-8 sequence waits for its next
                # bytes, and the last characters wait while they may begin a stop string.
                ready = len(text) - held if not text.endswith("\ufffd") else emitted
                if ready > emitted:
                    yield text[emitted:ready], tok
                    emitted = ready
                else:
                    yield "", tok
        finally:
            self.emitted = emitted

    def timing(self):
        n = len(self.tokens)
        return {"ttft_ms": round((self.ttft or 0) * 1000, 3),
                "decode_tokens_per_s": round((n - 1) / self.decode_s, 2) if n > 1 and self.decode_s > 0 else None,
                "cuda_graphs": DECODER.graph is not None, "batched": BATCHER is not None,
                **({"cuda_graph_error": DECODER.graph_error} if DECODER.graph_error else {})}

    def usage(self):
        return {"prompt_tokens": len(self.ids), "completion_tokens": len(self.tokens),
                "total_tokens": len(self.ids) + len(self.tokens)}


def _ids(chat):
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]


def complete(ids, opts):
    g = Generation(ids, opts)
    for _ in g.run():
        pass
    chat = opts["chat"]
    choice = {"index": 0, "finish_reason": g.finish, "logprobs": None}
    if chat:
        choice["message"] = {"role": "assistant", "content": g.text}
    else:
        choice["text"] = g.text
    if opts["return_token_ids"]:
        choice["token_ids"] = g.tokens
    out = {"id": _ids(chat), "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
           "model": MODEL_NAME, "choices": [choice], "usage": g.usage(), "faas_gpu": g.timing()}
    if opts["return_token_ids"]:
        out["prompt_token_ids"] = ids
    return out


def events(g):
    """The server-sent events of a streamed completion."""
    opts = g.opts
    chat = opts["chat"]
    cid, created = _ids(chat), int(time.time())
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(text, finish, token=None, usage=None, choices=True):
        c = {"index": 0, "finish_reason": finish, "logprobs": None}
        if chat:
            c["delta"] = {} if text is None else {"content": text}
        else:
            c["text"] = text or ""
        if opts["return_token_ids"] and token is not None:
            c["token_ids"] = [token]
        ev = {"id": cid, "object": obj, "created": created, "model": MODEL_NAME, "choices": [c] if choices else []}
        if usage is not None:
            ev["usage"] = usage
        return "data: %s\n\n" % json.dumps(ev)

    if chat:
        first = json.loads(chunk("", None)[6:])
        first["choices"][0]["delta"] = {"role": "assistant", "content": ""}
        yield "data: %s\n\n" % json.dumps(first)
    for text, tok in g.run():
        yield chunk(text, None, tok)
    last = json.loads(chunk(None if chat else "", g.finish)[6:])
    last["faas_gpu"] = g.timing()
    yield "data: %s\n\n" % json.dumps(last)
    if opts["include_usage"]:
        yield chunk(None, None, usage=g.usage(), choices=False)
    yield "data: [DONE]\n\n"


JSON = {"Content-Type": "application/json"}
SSE = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _error(status, message, param=None, kind="invalid_request_error"):
    return {"statusCode": status, "headers": JSON,
            "body": {"error": {"message": message, "type": kind, "param": param, "code": None}}}


def models():
    return {"object": "list", "data": [{"id": MODEL_NAME, "object": "model", "created": 0, "owned_by": "faas-gpu",
                                         "root": MODEL_DIR or None,
                                         "model_type": _model.config.model_type,
                                         "chat_template": "model" if CHAT_TEMPLATE else
                                         ("chatml" if not MODEL_DIR else None),
                                         "parameters": sum(p.numel() for p in _model.parameters()),
                                         "vocab_size": VOCAB, "max_prompt_tokens": MAX_PROMPT,
                                         "max_tokens": MAX_TOKENS,
                                         "adapter": None if ADAPTER_SEED is None else
                                         {"kind": "lora", "rank": ADAPTER_RANK, "seed": ADAPTER_SEED,
                                          "targets": ["q_proj", "v_proj"],
                                          "parameters": sum(p.numel() for p in adapter_parameters(_model))}}]}


def metrics():
    """The KV cache's and the batch's state in Prometheus' text format (paged: blocks as they are allocated and
    freed; with LLM_MAX_BATCH > 1 the batch's blocks and steps)."""
    kv = getattr(DECODER, "kv", None)
    lines = ["# HELP llm_kv_cache_paged 1 when the KV cache is paged (LLM_KV_CACHE=paged).",
             "# TYPE llm_kv_cache_paged gauge", "llm_kv_cache_paged %d" % (KV_CACHE == "paged")]
    vals = []
    if BATCHER is not None:
        bl = BATCHER.blocks
        vals = [("llm_kv_block_tokens", "gauge", "tokens per KV block", KV_BLOCK),
                ("llm_kv_block_bytes", "gauge", "bytes per KV block (all layers' keys and values)",
                 BATCHER.engine.block_bytes),
                ("llm_kv_blocks_in_use", "gauge", "KV blocks held by the sequences in the batch", bl.in_use),
                ("llm_kv_blocks_peak", "gauge", "the most KV blocks held at once", bl.peak),
                ("llm_kv_blocks_max", "gauge", "LLM_KV_MAX_BLOCKS (0: as the quota allows)", KV_MAX_BLOCKS),
                ("llm_kv_pool_blocks", "gauge", "KV blocks the device pool holds (freed when no sequence is "
                 "active)", bl.capacity),
                ("llm_kv_pool_grows_total", "counter", "times the device pool grew", bl.grows_total),
                ("llm_kv_block_allocations_total", "counter", "KV blocks given to sequences", bl.allocated_total),
                ("llm_kv_block_frees_total", "counter", "KV blocks taken back from sequences", bl.freed_total),
                ("llm_kv_block_refusals_total", "counter", "KV blocks or sequences that could not be had",
                 bl.refused_total),
                ("llm_batch_max", "gauge", "LLM_MAX_BATCH: sequences decoded together at most", MAX_BATCH),
                ("llm_batch_active", "gauge", "sequences in the running batch", BATCHER.batch_size()),
                ("llm_batch_waiting", "gauge", "sequences waiting to join the batch", len(BATCHER.waiting)),
                ("llm_batch_peak", "gauge", "the most sequences decoded in one step", BATCHER.peak_batch),
                ("llm_batch_steps_total", "counter", "decode steps", BATCHER.steps_total),
                ("llm_batch_step_sequences_total", "counter", "sequences decoded, summed over the steps",
                 BATCHER.step_sequences_total),
                ("llm_batch_prefills_total", "counter", "prefill passes (joining sequences together)",
                 BATCHER.prefills_total),
                ("llm_batch_sequences_total", "counter", "sequences submitted", BATCHER.sequences_total),
                ("llm_batch_cancelled_total", "counter", "sequences whose client went away before they ended",
                 BATCHER.cancelled_total)]
    elif KV_CACHE == "paged":
        vals = [("llm_kv_block_tokens", "gauge", "tokens per KV block", KV_BLOCK),
                ("llm_kv_block_bytes", "gauge", "bytes per KV block (all layers' keys and values)",
                 kv.block_bytes if kv else 0),
                ("llm_kv_blocks_in_use", "gauge", "KV blocks held by the sequence being decoded",
                 len(kv.blocks) if kv else 0),
                ("llm_kv_blocks_peak", "gauge", "the most KV blocks held at once", kv.peak if kv else 0),
                ("llm_kv_blocks_max", "gauge", "LLM_KV_MAX_BLOCKS (0: as the quota allows)", KV_MAX_BLOCKS),
                ("llm_kv_block_allocations_total", "counter", "KV blocks allocated",
                 kv.allocated_total if kv else 0),
                ("llm_kv_block_frees_total", "counter", "KV blocks freed", kv.freed_total if kv else 0),
                ("llm_kv_block_refusals_total", "counter", "KV blocks that could not be had",
                 kv.refused_total if kv else 0)]
    for name, kind, text, v in vals:
        lines += ["# HELP %s %s." % (name, text), "# TYPE %s %s" % (name, kind), "%s %d" % (name, v)]
    return "\n".join(lines) + "\n"


def handle(event, context):
    path = event.path.rstrip("/") or "/"
    if path in ("/v1/models", "/models") and event.method in ("GET", "HEAD"):
        return {"statusCode": 200, "headers": JSON, "body": models()}
    if path in ("/v1/completions", "/completions", "/v1/chat/completions", "/chat/completions"):
        if event.method != "POST":
            return _error(405, "%s takes POST" % path)
        chat = path.endswith("chat/completions")
        try:
            body = json.loads(event.body or b"{}")
        except ValueError as e:
            return _error(400, "body: invalid JSON: %s" % e)
        try:
            ids, opts = parse(body, chat)
        except BadRequest as e:
            return _error(e.status, e.message, e.param, "invalid_request_error" if e.status == 400 else "not_found")
        try:
            if opts["stream"]:
                # A stream whose sequence can never get its KV blocks is refused before its first byte; one that
                # cannot get a block later ends without its final chunk (the template's error path).
                g = Generation(ids, opts)
                g.check()
                return {"statusCode": 200, "headers": SSE, "body": events(g)}
            return {"statusCode": 200, "headers": JSON, "body": complete(ids, opts)}
        except KVExhausted as e:
            r = _error(429, "%s; retry later" % e, kind="rate_limit_exceeded")
            r["headers"] = dict(JSON, **{"Retry-After": "1"})
            return r
    if path == "/metrics" and event.method in ("GET", "HEAD"):
        return {"statusCode": 200, "headers": {"Content-Type": "text/plain; version=0.0.4"}, "body": metrics()}
    return _error(404, "no route %s %s: POST /v1/completions or /v1/chat/completions, GET /v1/models"
                  % (event.method, event.path), kind="not_found")
