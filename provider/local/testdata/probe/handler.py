"""probe: a test function that reports on its process and can crash on request."""

import json
import os


def handle(event, context):
    if event.query.get("crash"):
        os._exit(3)
    secret = event.query.get("secret")
    if secret:
        with open(os.path.join(os.environ["OPENFAAS_SECRETS_DIR"], secret)) as f:
            return f.read()
    print("request %s %s" % (event.method, event.path), flush=True)
    return {
        "statusCode": 200,
        "body": {
            "pid": os.getpid(),
            "body": event.body.decode(),
            "path": event.path,
            "query": dict(event.query),
            "hostname": context.hostname,
            "gpu": context.gpu,
            "env": {k: os.getenv(k, "") for k in ("EXTRA", "FROM_FUNCTION", "FAAS_GPU", "FAAS_GPU_FUNCTION", "FAAS_GPU_MEMORY_BYTES")},
        },
    }
