#!/usr/bin/env python
"""Build a tiny random-weight Qwen3-VL reranker (``Qwen3VLForSequenceClassification``) into a directory.

    python harness/servers/in_engine/tiny_rerank.py OUTDIR

The Qwen3-VL embedding recipe (tiny_model.py: tokenizer, processor, weights) with the config of Qwen3-VL-Reranker as
vLLM serves it: ``architectures = ["Qwen3VLForSequenceClassification"]``, ``is_original_qwen3_reranker`` and two
``classifier_from_token``. vLLM then makes the score head from the LM head's rows of the two tokens, as it does for
the real reranker ("no"/"yes"; here the byte tokens "n"/"y": the tiny vocabulary has no "yes"). Served with
``--runner pooling`` it answers /score, /rerank and /classify. Run with the engine's python; byte-identical every time.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tiny_common
import tiny_model as qwen
from tiny_common import step

RECIPE_VERSION = "mmchaos-tiny-qwen3vl-rerank-v1"
ARCHITECTURE = "Qwen3VLForSequenceClassification"
CLASSIFIER_TOKENS = ["n", "y"]  # false, true


def build(tmp):
    step(1, 4, "tokenizer (byte-level BPE + the Qwen special tokens)")
    ids, n_tok, n_merges = qwen.build_tokenizer(tmp)
    step(2, 4, "processor and reranker configs")
    qwen.write_processor_configs(tmp)
    cfg = qwen.model_config(ids)
    cfg.update(
        architectures=[ARCHITECTURE],
        classifier_from_token=CLASSIFIER_TOKENS,
        is_original_qwen3_reranker=True,
        num_labels=1,
        id2label={"0": "LABEL_0"},
        label2id={"LABEL_0": 0},
    )
    qwen.dump_json(os.path.join(tmp, "config.json"), cfg)
    step(3, 4, "weights (seeded, bf16; the score head comes from the LM head's rows)")
    n_params = qwen.build_weights(tmp)
    step(4, 4, "checking it loads and runs an image")
    n_img = qwen.verify(tmp, ids)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp)
    if [tok.convert_tokens_to_ids(t) for t in CLASSIFIER_TOKENS] != [ord(t) for t in CLASSIFIER_TOKENS]:
        raise RuntimeError(f"the classifier tokens {CLASSIFIER_TOKENS} are not single tokens")
    return {
        "recipe_version": RECIPE_VERSION,
        "name": "mmchaos-tiny-qwen3vl-rerank",
        "architecture": ARCHITECTURE,
        "params": n_params,
        "tokenizer_size": n_tok,
        "bpe_merges": n_merges,
        "vocab_size": qwen.VOCAB_SIZE,
        "image_tokens_40x56": n_img,
        "classifier_from_token": CLASSIFIER_TOKENS,
    }


if __name__ == "__main__":
    sys.exit(tiny_common.main(sys.argv, "tiny_rerank.py", RECIPE_VERSION, build))
