"""A Traffic (the mix of one Locust process) built from the options' defaults and a few changes, without Locust."""

from __future__ import annotations

import argparse

from mmchaos import options
from mmchaos.locustfiles.plugin.traffic import Traffic


def traffic(**over) -> Traffic:
    """The default options with a small generated pool (8 images), then ``over``."""
    o = argparse.Namespace(**{x.name: x.default for x in options.OPTIONS})
    o.image_preset, o.pool_size = "small", 8
    for k, v in over.items():
        setattr(o, k, v)
    return Traffic(o)


def only(**on: int) -> dict:
    """Weights that turn every kind off but those of ``on``."""
    return {f"weight_{k}": on.get(k, 0) for k in options.WEIGHTS}
