#!/usr/bin/env python
"""Build a tiny random-weight Qwen2-VL embedder (``Qwen2VLForConditionalGeneration``, as GME and DSE are) into a
directory.

    python harness/servers/in_engine/tiny_qwen2vl.py OUTDIR

tiny_model.py's tokenizer and chat template (Qwen2-VL has the same vision tokens), Qwen2-VL's processor (patch 14,
merge 2, temporal 2) and a two-layer text and vision tower; vLLM's ``--runner pooling`` embeds with it (last-token
pooling, as GME). Run with the engine's python; byte-identical every time.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tiny_common
import tiny_model as qwen
from tiny_common import meta_state_dict, save_weights, step

RECIPE_VERSION = "mmchaos-tiny-qwen2vl-v2"
ARCHITECTURE = "Qwen2VLForConditionalGeneration"
PATCH, MERGE, TEMPORAL = 14, 2, 2
DIM = 64


def write_configs(tmp, ids):
    path = os.path.join(tmp, "tokenizer_config.json")
    with open(path, encoding="utf-8") as f:
        tok_cfg = json.load(f)
    qwen.dump_json(path, dict(tok_cfg, processor_class="Qwen2VLProcessor"))
    common = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": qwen.MEAN_STD,
        "image_std": qwen.MEAN_STD,
        "merge_size": MERGE,
        "patch_size": PATCH,
        "temporal_patch_size": TEMPORAL,
        "resample": 3,
        "rescale_factor": 0.00392156862745098,
        "processor_class": "Qwen2VLProcessor",
        "min_pixels": 3136,
        "max_pixels": 1003520,
        "size": {"shortest_edge": 3136, "longest_edge": 1003520},
    }
    qwen.dump_json(
        os.path.join(tmp, "preprocessor_config.json"), dict(common, image_processor_type="Qwen2VLImageProcessor")
    )
    qwen.dump_json(
        os.path.join(tmp, "video_preprocessor_config.json"), dict(common, video_processor_type="Qwen2VLVideoProcessor")
    )
    qwen.dump_json(os.path.join(tmp, "processor_config.json"), {"processor_class": "Qwen2VLProcessor"})
    text = {
        "model_type": "qwen2_vl_text",
        "vocab_size": qwen.VOCAB_SIZE,
        "hidden_size": DIM,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        # head_dim 32 (hidden / heads; Qwen2 has no head_dim key): vLLM's CPU attention takes 32, 64, 80... and
        # refused v1's 16 at the first request ("Unsupported CPU attention configuration: head_dim=16")
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "use_cache": True,
        "tie_word_embeddings": True,
        # sum(mrope_section) == head_dim // 2
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [4, 6, 6]},
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "dtype": "bfloat16",
    }
    vision = {
        "model_type": "qwen2_vl_vision",
        "depth": 2,
        "embed_dim": DIM,
        "hidden_size": DIM,
        "mlp_ratio": 2,
        "num_heads": 2,
        "in_channels": 3,
        "patch_size": PATCH,
        "spatial_merge_size": MERGE,
        "temporal_patch_size": TEMPORAL,
        "hidden_act": "quick_gelu",
    }
    qwen.dump_json(
        os.path.join(tmp, "config.json"),
        {
            "architectures": [ARCHITECTURE],
            "model_type": "qwen2_vl",
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
        },
    )


def verify(tmp):
    import torch
    from transformers import AutoProcessor, Qwen2VLForConditionalGeneration

    proc = AutoProcessor.from_pretrained(tmp)
    if type(proc).__name__ != "Qwen2VLProcessor":
        raise RuntimeError(f"AutoProcessor gave {type(proc).__name__}")
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "a photo"}]}]
    prompt = proc.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    g = torch.Generator().manual_seed(qwen.SEED)
    image = (torch.rand(3, 56, 84, generator=g) * 255).to(torch.uint8)
    inputs = proc(text=[prompt], images=[image], return_tensors="pt")
    model, info = Qwen2VLForConditionalGeneration.from_pretrained(tmp, dtype=torch.bfloat16, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if bad:
        raise RuntimeError(f"weights do not match the architecture: {bad}")
    with torch.no_grad():
        h = model.model(**inputs).last_hidden_state[0, -1].float()
    if h.shape != (DIM,) or not torch.isfinite(h).all():
        raise RuntimeError(f"bad forward output {tuple(h.shape)}")


def build(tmp):
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    step(1, 4, "tokenizer (byte-level BPE + the Qwen special tokens)")
    ids, n_tok, n_merges = qwen.build_tokenizer(tmp)
    step(2, 4, "processor and model configs")
    write_configs(tmp, ids)
    step(3, 4, "weights (seeded, bf16)")
    cfg = Qwen2VLConfig.from_pretrained(tmp)
    n_params = save_weights(tmp, meta_state_dict(Qwen2VLForConditionalGeneration, cfg), skip=("lm_head.weight",))
    step(4, 4, "checking it loads and embeds an image")
    verify(tmp)
    return {
        "recipe_version": RECIPE_VERSION,
        "name": "mmchaos-tiny-qwen2vl",
        "architecture": ARCHITECTURE,
        "embedding_dim": DIM,
        "params": n_params,
        "tokenizer_size": n_tok,
        "bpe_merges": n_merges,
        "vocab_size": qwen.VOCAB_SIZE,
    }


if __name__ == "__main__":
    sys.exit(tiny_common.main(sys.argv, "tiny_qwen2vl.py", RECIPE_VERSION, build))
