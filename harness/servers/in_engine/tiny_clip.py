#!/usr/bin/env python
"""Build a tiny random-weight CLIP embedder (``CLIPModel``) into a directory.

    python harness/servers/in_engine/tiny_clip.py OUTDIR

vLLM serves ``CLIPModel`` with ``--runner pooling`` as an embedder of an image *or* a text, not both
(model_executor/models/clip.py: an image request must render to no text token but special ones). The chat template
here renders image parts as nothing and text parts as their text, so a chat request with one image embeds the image;
text goes as ``input``. The tokenizer is tiny_model.py's byte-level BPE with CLIP's start and end tokens around every
text. Run with the engine's python; byte-identical every time.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tiny_common
import tiny_model as qwen
from tiny_common import meta_state_dict, save_weights, step

RECIPE_VERSION = "mmchaos-tiny-clip-v1"
ARCHITECTURE = "CLIPModel"
BOS, EOS = "<|startoftext|>", "<|endoftext|>"
VOCAB_SIZE = 600
IMAGE_SIZE, PATCH = 32, 16
DIM = 64
MEAN, STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]  # CLIP's own
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for content in message['content'] -%}"
    "{%- if 'text' in content and content['type'] == 'text' -%}{{- content['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endfor -%}"
)


def _post_processor(ids):
    from tokenizers import processors

    return processors.TemplateProcessing(
        single=f"{BOS} $A {EOS}", pair=f"{BOS} $A {EOS} $B {EOS}", special_tokens=[(BOS, ids[BOS]), (EOS, ids[EOS])]
    )


def write_tokenizer(tmp):
    tk, ids, n_tok, n_merges = qwen.bpe_tokenizer([BOS, EOS], VOCAB_SIZE, _post_processor)
    qwen.dump_json(os.path.join(tmp, "tokenizer.json"), __import__("json").loads(tk.to_str()))
    with open(os.path.join(tmp, "chat_template.jinja"), "w", encoding="utf-8", newline="\n") as f:
        f.write(CHAT_TEMPLATE + "\n")
    added = {
        str(i): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t, i in ids.items()
    }
    qwen.dump_json(
        os.path.join(tmp, "tokenizer_config.json"),
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "added_tokens_decoder": added,
            "bos_token": BOS,
            "eos_token": EOS,
            "pad_token": EOS,
            "unk_token": None,
            "clean_up_tokenization_spaces": False,
            "model_max_length": 77,
            "processor_class": "CLIPProcessor",
        },
    )
    return ids, n_tok, n_merges


def write_configs(tmp, ids):
    qwen.dump_json(
        os.path.join(tmp, "preprocessor_config.json"),
        {
            "image_processor_type": "CLIPImageProcessor",
            "processor_class": "CLIPProcessor",
            "do_resize": True,
            "size": {"shortest_edge": IMAGE_SIZE},
            "do_center_crop": True,
            "crop_size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
            "do_rescale": True,
            "rescale_factor": 0.00392156862745098,
            "do_normalize": True,
            "image_mean": MEAN,
            "image_std": STD,
            "do_convert_rgb": True,
            "resample": 3,
        },
    )
    qwen.dump_json(os.path.join(tmp, "processor_config.json"), {"processor_class": "CLIPProcessor"})
    text = {
        "model_type": "clip_text_model",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": DIM,
        "intermediate_size": 128,
        "projection_dim": DIM,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "max_position_embeddings": 77,
        "hidden_act": "quick_gelu",
        "layer_norm_eps": 1e-5,
        "bos_token_id": ids[BOS],
        "eos_token_id": ids[EOS],
        "pad_token_id": ids[EOS],
    }
    vision = {
        "model_type": "clip_vision_model",
        "hidden_size": DIM,
        "intermediate_size": 128,
        "projection_dim": DIM,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_channels": 3,
        "image_size": IMAGE_SIZE,
        "patch_size": PATCH,
        "hidden_act": "quick_gelu",
        "layer_norm_eps": 1e-5,
    }
    qwen.dump_json(
        os.path.join(tmp, "config.json"),
        {
            "architectures": [ARCHITECTURE],
            "model_type": "clip",
            "text_config": text,
            "vision_config": vision,
            "projection_dim": DIM,
            "logit_scale_init_value": 2.6592,
            "dtype": "bfloat16",
        },
    )


def verify(tmp):
    import torch
    from transformers import AutoProcessor, CLIPModel

    proc = AutoProcessor.from_pretrained(tmp)
    model, info = CLIPModel.from_pretrained(tmp, dtype=torch.bfloat16, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if bad:
        raise RuntimeError(f"weights do not match the architecture: {bad}")
    g = torch.Generator().manual_seed(qwen.SEED)
    image = (torch.rand(3, 40, 56, generator=g) * 255).to(torch.uint8)
    inputs = proc(text=["a photo of a cat"], images=[image], return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model(**inputs)
    if out.image_embeds.shape != (1, DIM) or out.text_embeds.shape != (1, DIM):
        raise RuntimeError(f"bad embeddings {tuple(out.image_embeds.shape)} {tuple(out.text_embeds.shape)}")


def build(tmp):
    from transformers import CLIPConfig, CLIPModel

    step(1, 4, "tokenizer (byte-level BPE + CLIP's start and end tokens)")
    ids, n_tok, n_merges = write_tokenizer(tmp)
    step(2, 4, "processor and model configs")
    write_configs(tmp, ids)
    step(3, 4, "weights (seeded, bf16)")
    cfg = CLIPConfig.from_pretrained(tmp)
    n_params = save_weights(tmp, meta_state_dict(CLIPModel, cfg))
    step(4, 4, "checking it loads and embeds an image and a text")
    verify(tmp)
    return {
        "recipe_version": RECIPE_VERSION,
        "name": "mmchaos-tiny-clip",
        "architecture": ARCHITECTURE,
        "embedding_dim": DIM,
        "params": n_params,
        "tokenizer_size": n_tok,
        "bpe_merges": n_merges,
        "vocab_size": VOCAB_SIZE,
        "image_size": IMAGE_SIZE,
    }


if __name__ == "__main__":
    sys.exit(tiny_common.main(sys.argv, "tiny_clip.py", RECIPE_VERSION, build))
