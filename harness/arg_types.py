"""Argument types of the `mmchaos` command line: each says in one line what it wanted (argparse prints it)."""

from __future__ import annotations

import argparse
import math


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(text)


def positive_number(text: str) -> float:
    """A finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (1-65535)")
    return int(text)


def url(text: str) -> str:
    """An http(s) URL with a host and, if given, a port in range: said as "not a URL" before anything is started."""
    from urllib.parse import urlsplit

    try:
        u = urlsplit(text)
        port_ok = u.port is None or 1 <= u.port <= 65535
    except ValueError:  # a port that is not a number, or out of range
        port_ok, u = False, urlsplit("")
    if u.scheme not in ("http", "https") or not u.hostname or not port_ok:
        raise argparse.ArgumentTypeError(f"{text!r} is not a URL (http://HOST[:PORT], port 1-65535)")
    return text
