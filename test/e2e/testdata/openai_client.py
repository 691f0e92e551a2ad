"""Drives the llm function with the real OpenAI Python client (the pinned test/pyenv/openai-requirements.txt).

usage: openai_client.py BASE_URL MODEL MAX_TOKENS
Prints one JSON object: what each call answered, for the Go test to check.
"""
import json
import sys

import openai

base, model, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=600)
out = {"version": openai.__version__}

models = client.models.list()
out["models"] = [m.id for m in models.data]

# Greedy, whole answer, with the token ids (vLLM's extension, passed through extra_body).
extra = {"ignore_eos": True, "return_token_ids": True}
c = client.completions.create(model=model, prompt="The GPU pool", max_tokens=n, temperature=0, extra_body=extra)
out["greedy"] = {"text": c.choices[0].text, "token_ids": c.choices[0].model_extra.get("token_ids"),
                 "finish": c.choices[0].finish_reason, "usage": c.usage.model_dump(),
                 "faas_gpu": c.model_extra.get("faas_gpu")}

# The same request streamed: server-sent events, one per token.
chunks = list(client.completions.create(model=model, prompt="The GPU pool", max_tokens=n, temperature=0,
                                        stream=True, extra_body=extra))
out["stream"] = {"text": "".join(ch.choices[0].text for ch in chunks if ch.choices),
                 "token_ids": [t for ch in chunks if ch.choices for t in (ch.choices[0].model_extra.get("token_ids")
                                                                          or [])],
                 "events": len(chunks), "finish": chunks[-1].choices[0].finish_reason}

# Chat, sampled from a seed, streamed with the usage at the end.
stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hello"}],
                                        max_tokens=n, temperature=0.8, seed=7, stream=True,
                                        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
pieces, usage, roles = [], None, []
for ch in stream:
    if ch.usage is not None:
        usage = ch.usage.model_dump()
    for choice in ch.choices:
        if choice.delta.role:
            roles.append(choice.delta.role)
        if choice.delta.content:
            pieces.append(choice.delta.content)
out["chat_stream"] = {"text": "".join(pieces), "roles": roles, "usage": usage}
chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hello"}],
                                      max_tokens=n, temperature=0.8, seed=7, extra_body={"ignore_eos": True})
out["chat"] = {"text": chat.choices[0].message.content, "role": chat.choices[0].message.role,
               "usage": chat.usage.model_dump()}

# Bad input: 400 naming the field.
errors = {}
for name, kwargs in {"max_tokens": {"max_tokens": 10**6}, "prompt": {"prompt": "x " * 5000},
                     "temperature": {"temperature": 7}}.items():
    args = {"model": model, "prompt": "hi", "max_tokens": 1}
    args.update(kwargs)
    try:
        client.completions.create(**args)
        errors[name] = "accepted"
    except openai.BadRequestError as e:
        errors[name] = {"status": e.status_code, "param": (e.body or {}).get("param"),
                        "message": (e.body or {}).get("message")}
out["errors"] = errors
print(json.dumps(out))
