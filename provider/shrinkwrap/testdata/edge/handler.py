"""edge: exercises the gpu-python entrypoint's request and response handling."""


def handle(event, context):
    q = event.query
    if q.get("raise"):
        raise RuntimeError("boom")
    if q.get("tuple"):
        return ("tuple body", 201, {"X-T": "1"})
    if q.get("bytes"):
        return b"\x00\x01"
    if q.get("str"):
        return "plain"
    return {
        "statusCode": 202,
        "body": {
            "len": len(event.body),
            "method": event.method,
            "path": event.path,
            "multi": q.getlist("m"),
            "header": event.headers.get("x-test"),
            "gpu": context.gpu,
        },
        "headers": {"X-Handler": "yes"},
    }
