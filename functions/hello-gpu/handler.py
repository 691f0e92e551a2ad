"""hello-gpu: a GPU function (annotated com.openfaas.gpu.memory in stack.yml).

The template binds each request to a GPU of the node's pool before calling handle; the answer says which one:
{"message": ..., "gpu": <index>, "gpu_name": ..., "binding": <binding id>, "swap": ...}.
"""


def handle(event, context):
    gpu = context.gpu or {}
    name = event.query.get("name") or "world"
    return {
        "statusCode": 200,
        "body": {
            "message": "Hello, %s, from a GPU function" % name,
            "gpu": gpu.get("gpu"),
            "gpu_name": gpu.get("gpu_name"),
            "binding": gpu.get("id"),
            "swap": gpu.get("swap"),
        },
    }
