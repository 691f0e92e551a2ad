"""pipfn: a test function that needs a pip package (six, from function/requirements.txt) and reports where it
was imported from."""

import os
import sys

import six


def handle(event, context):
    return {
        "statusCode": 200,
        "body": {
            "six": six.__version__,
            "six_file": six.__file__,
            "prefix": sys.prefix,
            "executable": sys.executable,
            "virtual_env": os.getenv("VIRTUAL_ENV", ""),
        },
    }
