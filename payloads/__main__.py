"""Build (and so cache) an image pool, and say what it cost.

    python -m mmchaos.payloads [--n 1000] [--seed 0] [--preset realistic] [--max-side N] [--cache-dir DIR]
                       [--no-cache] [--workers K] [--image-dir DIR]

Run it once before a load test so Locust processes start on a warm cache (a cold build of 1,000 images takes
seconds of CPU in every process that needs it).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

from mmchaos.options import IMAGE_PRESETS

from .generated import generate_pool
from .user_images import load_image_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mmchaos.payloads", description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--preset", default="realistic", choices=sorted(IMAGE_PRESETS))
    ap.add_argument("--max-side", type=int)
    ap.add_argument("--cache-dir")
    ap.add_argument("--no-cache", action="store_true")
    ap.add_argument("--workers", type=int)
    ap.add_argument("--image-dir", help="load this folder of images instead of generating")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        if a.image_dir:
            pool = load_image_dir(a.image_dir)
        else:
            pool = generate_pool(
                a.n,
                a.seed,
                preset=a.preset,
                max_side=a.max_side,
                cache_dir=a.cache_dir,
                use_cache=not a.no_cache,
                workers=a.workers,
            )
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    info = pool.summary()
    info["seconds"] = round(time.perf_counter() - t0, 2)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    info["cpu_seconds"] = round(ru.ru_utime + ru.ru_stime, 2)
    info["peak_rss_mb"] = round(ru.ru_maxrss / 1024, 1)  # Linux: KiB
    print(json.dumps(info, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
