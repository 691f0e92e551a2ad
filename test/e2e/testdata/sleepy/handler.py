"""sleepy: a CPU function that holds each request for ?ms= milliseconds (default 200), then answers with its
instance's name (HOSTNAME): the autoscaling test's steady load."""

import os
import time


def handle(event, context):
    ms = int(event.query.get("ms") or "200")
    time.sleep(ms / 1000)
    return {"statusCode": 200, "body": os.getenv("HOSTNAME", "") + "\n", "headers": {"Content-Type": "text/plain"}}
