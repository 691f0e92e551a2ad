"""broken: a test function that fails at import, so its replicas exit before they are ready."""

raise SystemExit("broken: this handler fails at import on purpose")
