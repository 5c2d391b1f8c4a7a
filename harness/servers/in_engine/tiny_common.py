"""What the other tiny model recipes share besides tiny_model.py's tokenizer and processor: seeded weights of any
architecture (with heads transformers has no class for) and the atomic write of the finished, verified folder.

Imported by the recipe scripts (tiny_rerank.py, tiny_clip.py, tiny_qwen2vl.py) that the *engine's* python runs by
path; it imports nothing of mmchaos and never touches the network (each recipe imports tiny_model first, which sets
the offline variables).
"""

import hashlib
import os
import shutil

from tiny_model import SEED, die, dump_json, init_tensor


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
        files = sorted(os.listdir(tmp))
        if any(not os.path.isfile(os.path.join(tmp, f)) for f in files):
            raise RuntimeError(f"unexpected entries in {tmp}: {files}")
        digest = hashlib.sha256()
        for f in files:
            with open(os.path.join(tmp, f), "rb") as fh:
                digest.update(f.encode() + b"\0" + hashlib.sha256(fh.read()).digest())
        dump_json(
            os.path.join(tmp, "mmchaos-model.json"),
            dict(summary, seed=SEED, files=files, content_sha256=digest.hexdigest()),
        )
        for f in os.listdir(tmp):
            os.chmod(os.path.join(tmp, f), 0o644)
        os.chmod(tmp, 0o755)
        if os.path.isdir(out):
            old = f"{out}.old-{os.getpid()}"
            os.rename(out, old)
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
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
