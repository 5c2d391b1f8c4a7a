#!/usr/bin/env python
"""Build a tiny random-weight Qwen3-VL embedding model into a directory.

    python harness/servers/in_engine/tiny_model.py OUTDIR

Run it with the *engine* virtualenv's python (torch CPU + transformers 5.x + tokenizers).
It imports nothing from this repository and never touches the network.

What it writes (all deterministic: building twice gives byte-identical files):
  config.json                      Qwen3VLConfig (architectures: Qwen3VLForConditionalGeneration), bf16
  model.safetensors                ~0.7 M params, seeded init, bf16
  tokenizer.json / tokenizer_config.json / chat_template.jinja
                                   byte-level BPE (deterministic in-script trainer) + Qwen special tokens
  preprocessor_config.json         Qwen2VLImageProcessor (patch 16, merge 2, temporal 2)
  video_preprocessor_config.json   Qwen3VLVideoProcessor
  processor_config.json            Qwen3VLProcessor
  mmchaos-model.json               recipe version + summary, so callers can tell whether a dir is current

The directory is built next to OUTDIR as OUTDIR.tmp-<pid> and renamed into place only after
it has been verified to load (config, weights, tokenizer, processor, one image forward pass).
"""

import os

# No network, ever.  Must be set before transformers / huggingface_hub are imported.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"

import hashlib
import json
import shutil
import sys
import zlib
from collections import Counter

RECIPE_VERSION = "mmchaos-tiny-qwen3vl-v1"
MODEL_NAME = "mmchaos-tiny-qwen3vl"
SEED = 1234
MAX_MERGES = 300  # 256 byte symbols + <=300 merges + 14 specials  <=  VOCAB_SIZE
VOCAB_SIZE = 640  # padded embedding rows (>= tokenizer length)

# Qwen special tokens, in Qwen's own order (they get consecutive ids after the BPE vocab).
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

# Same pre-tokenisation regex as Qwen2/Qwen3 tokenizers.
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+"""
)

CORPUS = """\
A photo of a cat sitting on a red chair. A picture of a dog running in the park.
An image of a small house with a blue door, green trees and a white fence.
The quick brown fox jumps over the lazy dog. Hello world! Hello, how are you today?
What is shown in this image? Describe the picture in one sentence, please.
Represent the user's input for retrieval. Represent this image for searching relevant passages.
Find a document that answers the question. Given a query, retrieve relevant documents.
A video of people walking on a busy street at night, with cars and bright lights.
The chart shows sales numbers for 2023 and 2024: 10, 20, 30, 40, 50, 60, 70, 80, 90, 100.
Load testing sends many requests at the same time and measures the latency and the errors.
An embedding is a vector of numbers; similar inputs should have similar vectors.
the a an of in on at to for with from by and or not is are was were be been this that these those
I you he she it we they me him her us them my your his its our their what which who where when why how
red orange yellow green blue purple black white gray brown pink one two three four five six seven eight nine ten
cat dog bird fish horse cow sheep car bus train plane boat bike road street city river lake sea mountain sky sun
text image video audio document page table chart graph screenshot photo picture frame scene object person face
0 1 2 3 4 5 6 7 8 9 + - * / = < > ( ) [ ] { } : ; , . ! ? ' " # $ % & @ _ | ~ ^ `
"""

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- else -%}"
    "{%- for content in message['content'] -%}"
    "{%- if content['type'] == 'image' or content['type'] == 'image_url' or 'image' in content"
    " or 'image_url' in content -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif content['type'] == 'video' or content['type'] == 'video_url' or 'video' in content"
    " or 'video_url' in content -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif 'text' in content -%}"
    "{{- content['text'] -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- endif -%}"
)

PATCH, MERGE, TEMPORAL = 16, 2, 2
MEAN_STD = [0.5, 0.5, 0.5]


def die(msg, code=2):
    print(f"tiny_model: error: {msg}", file=sys.stderr)
    sys.exit(code)


def dump_json(path, obj):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False) + "\n")


def seal(tmp, out, summary):
    """The built folder ``tmp`` into place as ``out``, whole or not at all (every recipe's one folder swap): its files'
    hash goes into mmchaos-model.json with ``summary``, the files are made readable to all, and an older ``out`` is
    swapped out only once the new one is complete."""
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


# ----------------------------------------------------------------------------- tokenizer


def bytes_to_unicode():
    """GPT-2 byte -> printable unicode char table (what tokenizers' ByteLevel uses)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def make_pre_tokenizer():
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )


def train_bpe(pre_tok):
    """Tiny deterministic BPE trainer (ties broken lexicographically), pure Python."""
    words = Counter(piece for piece, _ in pre_tok.pre_tokenize_str(CORPUS))
    seqs = {w: tuple(w) for w in sorted(words)}
    byte_chars = bytes_to_unicode()
    vocab = {byte_chars[b]: b for b in range(256)}
    merges = []
    while len(merges) < MAX_MERGES:
        pairs = Counter()
        for w, syms in seqs.items():
            for i in range(len(syms) - 1):
                pairs[(syms[i], syms[i + 1])] += words[w]
        if not pairs:
            break
        best, count = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        if count < 2:
            break
        merges.append(best)
        new_tok = best[0] + best[1]
        if new_tok not in vocab:
            vocab[new_tok] = len(vocab)
        for w, syms in seqs.items():
            if len(syms) < 2:
                continue
            out, i = [], 0
            while i < len(syms):
                if i + 1 < len(syms) and syms[i] == best[0] and syms[i + 1] == best[1]:
                    out.append(new_tok)
                    i += 2
                else:
                    out.append(syms[i])
                    i += 1
            seqs[w] = tuple(out)
    return vocab, merges


def bpe_tokenizer(special_tokens, vocab_size, post_processor=None):
    """The byte-level BPE with ``special_tokens`` given the ids after it, in order (every recipe's tokenizer):
    (tokenizer, {token: id}, tokenizer size, merges). ``post_processor(special_ids)``: what the tokenizer adds
    around a text (CLIP's start and end tokens)."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers
    from tokenizers.models import BPE

    pre_tok = make_pre_tokenizer()
    vocab, merges = train_bpe(pre_tok)
    special_ids = {}
    for tok in special_tokens:
        special_ids[tok] = vocab[tok] = len(vocab)
    if len(vocab) > vocab_size:
        raise RuntimeError(f"tokenizer has {len(vocab)} tokens > VOCAB_SIZE {vocab_size}")

    tk = Tokenizer(
        BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tok
    tk.decoder = decoders.ByteLevel()
    if post_processor is not None:
        tk.post_processor = post_processor(special_ids)
    tk.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False, lstrip=False, rstrip=False, single_word=False)
            for t in special_tokens
        ]
    )
    for tok, i in special_ids.items():
        if tk.token_to_id(tok) != i:
            raise RuntimeError(f"special token {tok} got id {tk.token_to_id(tok)}, expected {i}")
    return tk, special_ids, len(vocab), len(merges)


def build_tokenizer(tmp):
    tk, special_ids, n_tok, n_merges = bpe_tokenizer(SPECIAL_TOKENS, VOCAB_SIZE)
    dump_json(os.path.join(tmp, "tokenizer.json"), json.loads(tk.to_str()))
    with open(os.path.join(tmp, "chat_template.jinja"), "w", encoding="utf-8", newline="\n") as f:
        f.write(CHAT_TEMPLATE + "\n")
    added = {
        str(special_ids[t]): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    dump_json(
        os.path.join(tmp, "tokenizer_config.json"),
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "added_tokens_decoder": added,
            "additional_special_tokens": [t for t in SPECIAL_TOKENS if t not in ("<|endoftext|>", "<|im_end|>")],
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": None,
            "clean_up_tokenization_spaces": False,
            "errors": "replace",
            "model_max_length": 32768,
            "split_special_tokens": False,
            "processor_class": "Qwen3VLProcessor",
        },
    )
    return special_ids, n_tok, n_merges


# ----------------------------------------------------------------------------- processor


def write_processor_configs(tmp):
    common = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": MEAN_STD,
        "image_std": MEAN_STD,
        "merge_size": MERGE,
        "patch_size": PATCH,
        "temporal_patch_size": TEMPORAL,
        "resample": 3,
        "rescale_factor": 0.00392156862745098,
        "processor_class": "Qwen3VLProcessor",
    }
    dump_json(
        os.path.join(tmp, "preprocessor_config.json"),
        dict(
            common, image_processor_type="Qwen2VLImageProcessor", size={"shortest_edge": 65536, "longest_edge": 1048576}
        ),
    )
    # Video longest_edge is kept at the image cap (real Qwen3-VL: 25165824) so that vLLM's start-up
    # profiling uses images, not one huge dummy video: ~20 s faster start, and it avoids the dummy-video
    # call that vllm 0.30 + transformers >= 5.2x rejects ("Found 1 <|video_pad|> tokens ... no videos").
    dump_json(
        os.path.join(tmp, "video_preprocessor_config.json"),
        dict(
            common,
            video_processor_type="Qwen3VLVideoProcessor",
            size={"shortest_edge": 4096, "longest_edge": 1048576},
            do_sample_frames=True,
            fps=2,
            min_frames=4,
            max_frames=768,
        ),
    )
    dump_json(os.path.join(tmp, "processor_config.json"), {"processor_class": "Qwen3VLProcessor"})


# ----------------------------------------------------------------------------- model


def model_config(ids):
    text = {
        "model_type": "qwen3_vl_text",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-6,
        "use_cache": True,
        "attention_bias": False,
        "attention_dropout": 0.0,
        # transformers 5.x form (replaces rope_scaling + rope_theta); sum(mrope_section) == head_dim // 2
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 5000000.0,
            "mrope_section": [6, 5, 5],
            "mrope_interleaved": True,
        },
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "tie_word_embeddings": True,
        "dtype": "bfloat16",
    }
    vision = {
        "model_type": "qwen3_vl_vision",
        "depth": 2,
        "hidden_size": 64,
        "hidden_act": "gelu_pytorch_tanh",
        "intermediate_size": 128,
        "num_heads": 2,
        "in_channels": 3,
        "patch_size": PATCH,
        "spatial_merge_size": MERGE,
        "temporal_patch_size": TEMPORAL,
        "out_hidden_size": 64,
        "num_position_embeddings": 2304,
        "deepstack_visual_indexes": [1],
        "initializer_range": 0.02,
    }
    return {
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "model_type": "qwen3_vl",
        "text_config": text,
        "vision_config": vision,
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "tie_word_embeddings": True,
        "dtype": "bfloat16",
    }


def init_tensor(name, shape, torch):
    """Seeded init that depends only on (SEED, name, shape), not on transformers' init code."""
    if len(shape) == 1 and name.endswith(".bias"):
        return torch.zeros(shape, dtype=torch.float32)
    if len(shape) == 1 and "norm" in name.rsplit(".", 2)[-2] and name.endswith(".weight"):
        return torch.ones(shape, dtype=torch.float32)
    g = torch.Generator().manual_seed(SEED * 1_000_003 + zlib.crc32(name.encode()))
    return torch.randn(tuple(shape), generator=g, dtype=torch.float32) * 0.02


def build_weights(tmp):
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    torch.manual_seed(SEED)
    cfg = Qwen3VLConfig.from_pretrained(tmp)
    with torch.device("meta"):
        model = Qwen3VLForConditionalGeneration(cfg)
    sd = model.state_dict()
    tensors = {}
    for name in sorted(sd):
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # tied to model.language_model.embed_tokens.weight
        if sd[name].dtype not in (torch.float32, torch.bfloat16, torch.float16):
            continue
        tensors[name] = init_tensor(name, list(sd[name].shape), torch).to(torch.bfloat16).contiguous()
    save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    return sum(t.numel() for t in tensors.values())


# ----------------------------------------------------------------------------- verify


def verify(tmp, ids):
    import torch
    from transformers import AutoProcessor, AutoTokenizer, Qwen3VLForConditionalGeneration

    tok = AutoTokenizer.from_pretrained(tmp)
    for t, i in ids.items():
        if tok.convert_tokens_to_ids(t) != i:
            raise RuntimeError(f"tokenizer id mismatch for {t}")
    text = "Hello world! A photo of a cat, 2024."
    if tok.decode(tok(text)["input_ids"]) != text:
        raise RuntimeError("tokenizer does not round-trip")
    proc = AutoProcessor.from_pretrained(tmp)
    if type(proc).__name__ != "Qwen3VLProcessor":
        raise RuntimeError(f"AutoProcessor gave {type(proc).__name__}")
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "a photo"}]}]
    prompt = proc.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    want = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>a photo<|im_end|>\n"
    if prompt != want:
        raise RuntimeError(f"chat template gave {prompt!r}")
    g = torch.Generator().manual_seed(SEED)
    image = (torch.rand(3, 40, 56, generator=g) * 255).to(torch.uint8)
    inputs = proc(text=[prompt], images=[image], return_tensors="pt")
    n_img = int((inputs["input_ids"] == ids["<|image_pad|>"]).sum())
    model, info = Qwen3VLForConditionalGeneration.from_pretrained(tmp, dtype=torch.bfloat16, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if bad:
        raise RuntimeError(f"weights do not match the architecture: {bad}")
    model.eval()
    with torch.no_grad():
        out = model.model(**inputs)
    h = out.last_hidden_state[0, -1].float()
    if h.shape != (64,) or not torch.isfinite(h).all():
        raise RuntimeError(f"bad forward output {tuple(h.shape)}")
    return n_img


# ----------------------------------------------------------------------------- main


def step(n: int, what: str) -> None:
    print(f"step {n}/5: {what}", flush=True)  # the caller shows lines starting with "step "


def main(argv):
    if len(argv) != 2 or argv[1].startswith("-"):
        die("usage: tiny_model.py OUTDIR")
    out = os.path.abspath(argv[1])
    parent = os.path.dirname(out)
    if not os.path.isdir(parent):
        die(f"parent directory does not exist: {parent}")
    if os.path.exists(out) and not os.path.isdir(out):
        die(f"exists and is not a directory: {out}")

    tmp = f"{out}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        step(1, "tokenizer (byte-level BPE + the Qwen special tokens)")
        ids, n_tok, n_merges = build_tokenizer(tmp)
        step(2, "processor configs")
        write_processor_configs(tmp)
        dump_json(os.path.join(tmp, "config.json"), model_config(ids))
        step(3, "weights (seeded, bf16)")
        n_params = build_weights(tmp)
        step(4, "checking it loads and embeds an image")
        n_img = verify(tmp, ids)
        step(5, "writing")
        summary = {
            "recipe_version": RECIPE_VERSION,
            "name": MODEL_NAME,
            "architecture": "Qwen3VLForConditionalGeneration",
            "embedding_dim": 64,
            "params": n_params,
            "tokenizer_size": n_tok,
            "bpe_merges": n_merges,
            "vocab_size": VOCAB_SIZE,
            "image_tokens_40x56": n_img,
        }
        seal(tmp, out, summary)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"tiny model {RECIPE_VERSION}: {out} ({size} bytes, {n_params} params)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
