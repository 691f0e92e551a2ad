"""echo: answers with the request body (a CPU function, no GPU annotation).

With the query ?secret=<name> it answers with the content of the function's secret <name> instead, read from
$OPENFAAS_SECRETS_DIR/<name> (default /var/openfaas/secrets, where OpenFaaS mounts secrets); the function must
name the secret in its deployment (secrets: [<name>]). An unknown secret answers 404.
"""

import os


def handle(event, context):
    name = event.query.get("secret")
    if name is None:
        return {
            "statusCode": 200,
            "body": event.body,
            "headers": {"Content-Type": event.headers.get("Content-Type") or "text/plain"},
        }
    if not name or "/" in name or name.startswith("."):
        return {"statusCode": 400, "body": "query parameter secret must name a secret\n"}
    secrets_dir = os.getenv("OPENFAAS_SECRETS_DIR", "/var/openfaas/secrets")
    try:
        with open(os.path.join(secrets_dir, name), "rb") as f:
            value = f.read()
    except FileNotFoundError:
        return {"statusCode": 404, "body": "secret %s is not mounted in this function\n" % name}
    return {"statusCode": 200, "body": value, "headers": {"Content-Type": "text/plain"}}
