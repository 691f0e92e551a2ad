"""probe: a test function that reports on its process and can crash on request."""

import json
import os
import time


def handle(event, context):
    if event.query.get("crash"):
        os._exit(3)
    hold = event.query.get("hold")
    if hold:
        # Answer only once the test creates the file named by hold: a request that stays in flight for as long as
        # the test needs, without a timing guess.
        print("holding %s" % hold, flush=True)
        while not os.path.exists(hold):
            time.sleep(0.01)
        return {"statusCode": 200, "body": {"pid": os.getpid(), "held": hold}}
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
            "env": {k: os.getenv(k, "") for k in ("EXTRA", "FROM_FUNCTION", "FAAS_GPU", "FAAS_GPU_FUNCTION", "FAAS_GPU_MEMORY_BYTES", "FAAS_GPU_SLO", "FAAS_GPU_SLO_PERCENTILE", "FAAS_GPU_ISOLATION", "VIA_INTERPRETER")},
        },
    }
