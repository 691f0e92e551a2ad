def handle(event, context):
    """Answer one HTTP request.

    event:   body (bytes), headers, method, query, path
    context: hostname, and gpu (a dict: id, gpu, gpu_name, swap) while the request is bound to a GPU, else None

    Return a dict {"statusCode": int, "body": str|bytes|dict|list, "headers": dict}, or a str/bytes body.
    """
    return {
        "statusCode": 200,
        "body": "Hello from OpenFaaS!",
    }
