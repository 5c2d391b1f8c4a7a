"""The API key of the server under test: read from MMCHAOS_API_KEY, or from the file MMCHAOS_API_KEY_FILE names,
and sent as a bearer token. Nothing else in mmchaos reads it."""

from __future__ import annotations

import os
from pathlib import Path

from mmchaos.errors import MmchaosError

API_KEY_ENV = "MMCHAOS_API_KEY"
API_KEY_FILE_ENV = "MMCHAOS_API_KEY_FILE"


class ApiKeyError(MmchaosError):
    """The key file cannot be read (one line, with the fix)."""


def api_key() -> str | None:
    if os.environ.get(API_KEY_ENV):
        return os.environ[API_KEY_ENV].strip()
    f = os.environ.get(API_KEY_FILE_ENV)
    if f:
        try:
            return Path(f).read_text().strip()
        except OSError as e:
            raise ApiKeyError(f"cannot read the API key file {f} ({e.strerror}); fix {API_KEY_FILE_ENV}") from e
    return None


def auth_headers(key: str | None = None) -> dict[str, str]:
    """The bearer header for ``key`` (default: this process's MMCHAOS_API_KEY), none without a key."""
    key = key or api_key()
    return {"Authorization": f"Bearer {key}"} if key else {}
