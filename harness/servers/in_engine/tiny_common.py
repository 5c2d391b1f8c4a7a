"""What the other tiny model recipes share besides tiny_model.py's tokenizer and processor: seeded weights of any
architecture (with heads transformers has no class for) and the atomic write of the finished, verified folder.

Imported by the recipe scripts (tiny_rerank.py, tiny_clip.py, tiny_qwen2vl.py) that the *engine's* python runs by
path; it imports nothing of mmchaos and never touches the network (each recipe imports tiny_model first, which sets
the offline variables).
"""

import os
import shutil

from tiny_model import SEED, die, init_tensor, seal


def step(n: int, total: int, what: str) -> None:
    print(f"step {n}/{total}: {what}", flush=True)  # the caller shows lines starting with "step "


# ----------------------------------------------------------------------------- weights


def save_weights(tmp, state_shapes, skip=(), extra=None):
    """model.safetensors from ``{name: (shape, dtype)}`` (a meta-device state dict's), seeded, bf16; ``skip``:
    names left out (tied weights), ``extra``: more names and shapes (a head transformers has no class for)."""
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(SEED)
    shapes = {
        n: list(t.shape)
        for n, t in state_shapes.items()
        if n not in skip and t.dtype in (torch.float32, torch.bfloat16, torch.float16)
    }
    shapes.update(extra or {})
    tensors = {n: init_tensor(n, shapes[n], torch).to(torch.bfloat16).contiguous() for n in sorted(shapes)}
    save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    return sum(t.numel() for t in tensors.values())


def meta_state_dict(model_cls, cfg):
    import torch

    with torch.device("meta"):
        return model_cls(cfg).state_dict()


# ----------------------------------------------------------------------------- the folder


def write_folder(out, build):
    """Build into ``OUTDIR.tmp-<pid>`` with ``build(tmp) -> summary`` and rename it into place only when it has
    returned (it verifies that the model loads); the summary goes into mmchaos-model.json with the files' hash."""
    tmp = f"{out}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        summary = build(tmp)
        seal(tmp, out, summary)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return summary


def main(argv, script: str, recipe_version: str, build) -> int:
    """A recipe's command line: ``script OUTDIR`` builds the model into OUTDIR with ``build`` and says what it wrote."""
    if len(argv) != 2 or argv[1].startswith("-"):
        die(f"usage: {script} OUTDIR")
    out = os.path.abspath(argv[1])
    if not os.path.isdir(os.path.dirname(out)):
        die(f"parent directory does not exist: {os.path.dirname(out)}")
    summary = write_folder(out, build)
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"tiny model {recipe_version}: {out} ({size} bytes, {summary['params']} params)")
    return 0
