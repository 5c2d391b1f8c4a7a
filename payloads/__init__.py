"""What to send. The image pool: ``pool`` (its types), ``generated`` (synthetic images, painted by ``painting``
and encoded by ``encode``), ``user_images`` (a folder of the user's), ``shared_pool`` (one per process),
``fresh`` (never-repeated variants); ``reuse`` (which image next); ``bodies`` (request builders); the malformed
cases: ``catalogue`` (+ ``malformed_cases.toml``), ``mutations``, ``patches`` and ``malformed`` (a case's
request). ``python -m mmchaos.payloads`` warms the image cache."""
