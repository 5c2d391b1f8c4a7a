"""What to send: ``images`` (the image pool), ``reuse`` (which image next), ``requests`` (request bodies),
``malformed`` (+ ``malformed_cases.toml``: the malformed-request catalogue). ``python -m payloads`` warms the
image cache."""
