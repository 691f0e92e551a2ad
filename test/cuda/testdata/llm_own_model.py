# llm_own_model.py: the llm function (functions/llm) serving a model directory of its own (LLM_MODEL_DIR).
#
#   llm_own_model.py make DIR [FAMILY...]
#                               writes tiny models of each family (qwen2, llama, mistral) with save_pretrained into
#                               DIR/tiny-<family> (a byte-level BPE tokenizer trained here from a few lines, with the
#                               family's special tokens and chat template), and broken ones (DIR/broken-*); nothing
#                               is downloaded (FAMILY...: only those, without the broken ones). Prints
#                               {"dirs": [...]}.
#   llm_own_model.py serve      imports the handler with LLM_MODEL_DIR from the environment and prints, as one JSON
#                               object: /v1/models, a greedy completion and a chat completion (their prompt token
#                               ids decoded back to text, with special tokens), a stream's tokens, answers to bad
#                               requests, whether the weights on the device equal the files' tensors, and, when the
#                               handler runs on the CPU, transformers' own generate() on the same directory (the
#                               reference).
import json, os, sys

FAMILIES = {
    # family: (special tokens, bos, eos, chat template, tie embeddings)
    "qwen2": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None, "<|im_end|>",
              "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}", True),
    "llama": (["<s>", "</s>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"], "<s>", "<|eot_id|>",
              "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
              "{{ m['content'] }}<|eot_id|>{% endfor %}"
              "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}", False),
    "mistral": (["<unk>", "<s>", "</s>", "[INST]", "[/INST]"], "<s>", "</s>",
                "{{ bos_token }}{% for m in messages %}"
                "{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
                "{{ raise_exception('roles must alternate user/assistant') }}{% endif %}"
                "{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
                "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}", False),
}
TEXT = """The GPU pool of a node serves many functions. A function binds a GPU only while a request runs.
Weights are copied to the GPU at swap-in; the KV cache grows as a sequence decodes. Hello, world!
Qwen, Llama and Mistral are decoder-only transformers. 0123456789 +-*/ = () [] {} <> ,.;:!? "quotes" 'single'
"""


def make(out, only):
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    dirs = []
    for fam, (special, bos, eos, template, tied) in FAMILIES.items():
        if only and fam not in only:
            continue
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=400, min_frequency=1, special_tokens=special,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train_from_iterator([TEXT] * 4, trainer)
        if bos:  # Llama and Mistral tokenizers put <s> before a text
            tok.post_processor = processors.TemplateProcessing(single=bos + " $A", special_tokens=[
                (bos, tok.token_to_id(bos))])
        fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos,
                                                    unk_token="<unk>" if fam == "mistral" else None,
                                                    pad_token=special[0])
        fast.chat_template = template
        d = os.path.join(out, "tiny-" + fam)
        fast.save_pretrained(d)
        common = dict(vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=tied, eos_token_id=fast.convert_tokens_to_ids(eos),
                      bos_token_id=fast.convert_tokens_to_ids(bos) if bos else None,
                      pad_token_id=fast.convert_tokens_to_ids(special[0]))
        if fam == "qwen2":
            config = transformers.Qwen2Config(rope_theta=1000000.0, **common)
        elif fam == "llama":
            config = transformers.LlamaConfig(**common)
        else:
            config = transformers.MistralConfig(sliding_window=4096, **common)
        torch.manual_seed(list(FAMILIES).index(fam) + 1)
        model = transformers.AutoModelForCausalLM.from_config(config)
        with torch.no_grad():  # larger than the default init, so that greedy choices are far apart
            for name, p in model.named_parameters():
                if not name.endswith("norm.weight"):
                    p.copy_(torch.randn(p.shape) * 0.2)
        model.generation_config.eos_token_id = [fast.convert_tokens_to_ids(eos), fast.convert_tokens_to_ids(
            special[0] if fam == "qwen2" else eos)]
        model.save_pretrained(d)  # safetensors
        dirs.append(d)
    if only:
        print(json.dumps({"dirs": dirs}))
        return
    # Broken directories whose damage only PyTorch's side sees.
    import shutil
    from safetensors.torch import load_file, save_file
    src = os.path.join(out, "tiny-llama")
    miss = os.path.join(out, "broken-missing-tensor")
    shutil.copytree(src, miss)
    t = load_file(os.path.join(miss, "model.safetensors"))
    del t["model.layers.1.mlp.down_proj.weight"]
    save_file(t, os.path.join(miss, "model.safetensors"), metadata={"format": "pt"})
    shape = os.path.join(out, "broken-shape")
    shutil.copytree(src, shape)
    with open(os.path.join(shape, "config.json")) as f:
        c = json.load(f)
    c["intermediate_size"] = 96
    with open(os.path.join(shape, "config.json"), "w") as f:
        json.dump(c, f)
    for name, fam, key, value in (("broken-window", "tiny-mistral", "sliding_window", 16),
                                  ("broken-context", "tiny-qwen2", "max_position_embeddings", 32)):
        d = os.path.join(out, name)
        shutil.copytree(os.path.join(out, fam), d)
        with open(os.path.join(d, "config.json")) as f:
            c = json.load(f)
        c[key] = value
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(c, f)
    badtok = os.path.join(out, "broken-tokenizer")
    shutil.copytree(src, badtok)
    with open(os.path.join(badtok, "tokenizer.json"), "w") as f:
        f.write('{"version": "1.0", "model": {"type": "nonsense"}}')
    print(json.dumps({"dirs": dirs}))


class Event:
    def __init__(self, path, body):
        self.body, self.headers, self.method, self.query, self.path = json.dumps(body).encode(), {}, "POST", {}, path


def serve():
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "functions", "llm"))
    import handler
    import torch
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    d = os.environ["LLM_MODEL_DIR"]
    out = {"models": handler.handle(type("E", (), {"path": "/v1/models", "method": "GET"})(), None)["body"]}
    out["device"] = handler.DEVICE.type
    out["dtype"] = str(handler.DTYPE).replace("torch.", "")
    out["stop_ids"] = sorted(handler.STOP_IDS)
    raw = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    decode = lambda ids: raw.decode(ids, skip_special_tokens=False)
    prompt = "The GPU pool of a node"
    n = 12
    r = handler.handle(Event("/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0,
                                                  "ignore_eos": True, "return_token_ids": True,
                                                  "model": handler.MODEL_NAME}), None)
    assert r["statusCode"] == 200, r
    b = r["body"]
    out["completion"] = {"model": b["model"], "prompt_token_ids": b["prompt_token_ids"],
                         "expected_prompt_ids": raw.encode(prompt).ids, "tokens": b["choices"][0]["token_ids"],
                         "text": b["choices"][0]["text"]}
    msgs = [{"role": "user", "content": "Hello"}]
    if handler._model.config.model_type != "mistral":
        msgs = [{"role": "developer", "content": "Be brief."}] + msgs
    r = handler.handle(Event("/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "temperature": 0,
                                                       "ignore_eos": True, "return_token_ids": True}), None)
    assert r["statusCode"] == 200, r
    out["chat"] = {"prompt": decode(r["body"]["prompt_token_ids"]), "model": r["body"]["model"]}
    st = handler.handle(Event("/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0,
                                                   "ignore_eos": True, "return_token_ids": True, "stream": True}),
                        None)
    toks = []
    for ev in st["body"]:
        if ev.startswith("data: {"):
            e = json.loads(ev[6:])
            if e["model"] != handler.MODEL_NAME:
                toks.append("wrong model %r" % e["model"])
            for c in e["choices"]:
                toks += c.get("token_ids", [])
    out["stream_tokens"] = toks
    if handler.KV_CACHE == "paged":
        # The KV blocks held while a stream decodes (after each event), after it, and a request refused for want of
        # blocks (LLM_KV_MAX_BLOCKS) followed by one that fits.
        def m():
            r = handler.handle(type("E", (), {"path": "/metrics", "method": "GET"})(), None)
            return {l.split()[0]: int(l.split()[1]) for l in r["body"].splitlines() if not l.startswith("#")}
        held = []
        st = handler.handle(Event("/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0,
                                                       "ignore_eos": True, "stream": True}), None)
        for ev in st["body"]:
            if ev.startswith("data: {") and json.loads(ev[6:])["choices"][0]["finish_reason"] is None:
                held.append(m()["llm_kv_blocks_in_use"])
        after = m()
        long = handler.handle(Event("/v1/completions", {"prompt": [5] * 60, "max_tokens": 1}), None)
        refused = [long["statusCode"], long["headers"].get("Retry-After"),
                   long["body"]["error"]["message"] if long["statusCode"] != 200 else ""]
        ok = handler.handle(Event("/v1/completions", {"prompt": prompt, "max_tokens": 2, "temperature": 0}), None)
        out["paged"] = {"held": held, "after": after, "refused": refused, "then": ok["statusCode"],
                        "final": m(), "prompt_tokens": len(out["completion"]["prompt_token_ids"])}
    bad = {}
    r = handler.handle(Event("/v1/completions", {"prompt": prompt, "model": "someone-else"}), None)
    bad["model"] = [r["statusCode"], r["body"]["error"]["param"]]
    r = handler.handle(Event("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"},
                                                                    {"role": "user", "content": "b"}]}), None)
    bad["alternation"] = [r["statusCode"], (r["body"].get("error") or {}).get("param")]
    r = handler.handle(Event("/v1/completions", {"prompt": [handler.VOCAB]}), None)
    bad["token_id"] = [r["statusCode"], r["body"]["error"]["param"]]
    out["bad"] = bad
    # The weights on the device are the files' tensors (copies are computed in dry mode too).
    files = load_file(os.path.join(d, "model.safetensors"))
    state = handler._model.state_dict()
    out["weights_equal"] = all(torch.equal(state[k].detach().cpu(), v.to(handler.DTYPE)) for k, v in files.items())
    out["weights_on_device"] = all(p.device.type == handler.DEVICE.type for p in handler._model.parameters())
    out["tensors"] = len(files)
    if handler.DEVICE.type == "cpu":
        import transformers
        ref = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=handler.DTYPE).eval()
        ids = torch.tensor([out["completion"]["prompt_token_ids"]])
        with torch.no_grad():
            g = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
        out["reference_tokens"] = g[0, ids.shape[1]:].tolist()
    print(json.dumps(out))


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3:])
    else:
        serve()
