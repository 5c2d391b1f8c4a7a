"""Flag sets drawn from a version's own `vllm serve --help` (--flags-axis auto); a flag set as options."""

from __future__ import annotations

import argparse

import pytest
from conftest import require_engine_and_model

from mmchaos.harness.hunt import axis, flag_draw


def _help() -> str:
    """Help in argparse's own layout, with vLLM's "(default: X)" suffix: what `vllm serve --help=all` prints."""
    p = argparse.ArgumentParser(prog="vllm serve", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    cache = p.add_argument_group("CacheConfig", "Configuration for the KV cache.")
    cache.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True, help="cache")
    cache.add_argument("--block-size", type=int, default=16, help="tokens per block")
    mm = p.add_argument_group("MultiModalConfig", "Configuration for multimodal models.")
    mm.add_argument("--mm-processor-cache-type", choices=["lru", "shm"], default="lru", help="type")
    mm.add_argument("--mm-processor-cache-gb", type=float, default=4.0, help="size")
    mm.add_argument("--media-io-kwargs", default="{}", help="a JSON of kwargs")
    model = p.add_argument_group("ModelConfig", "Configuration for the model.")
    model.add_argument("--model", default="Qwen/Qwen3-0.6B", help="the model")
    model.add_argument("--chat-template-path", metavar="PATH", default=None, help="a file")
    front = p.add_argument_group("Frontend", "Arguments for the server.")
    front.add_argument("--port", type=int, default=8000, help="its port")
    return p.format_help()


def test_options_are_read_with_their_choices_pairs_and_numbers_and_places_left_out():
    by_name = {o.names[0]: o for o in flag_draw.parse(_help())}
    assert set(by_name) == {
        "--enable-prefix-caching",
        "--block-size",
        "--mm-processor-cache-type",
        "--mm-processor-cache-gb",
    }  # --model, a PATH, a JSON of kwargs and the Frontend group's --port are not drawn
    assert by_name["--enable-prefix-caching"].values() == [["--no-enable-prefix-caching"]]  # its default is on
    assert by_name["--mm-processor-cache-type"].values() == [["--mm-processor-cache-type", "shm"]]
    assert by_name["--block-size"].values() == [["--block-size", v] for v in ("0", "1", "8", "32")]
    assert ["--mm-processor-cache-gb", "4.0"] not in by_name["--mm-processor-cache-gb"].values()


def test_drawn_sets_are_distinct_small_and_follow_the_seed():
    options = flag_draw.parse(_help())
    sets = flag_draw.draw(options, 5, seed=1)
    assert len(sets) == 5 and len({tuple(s) for s in sets}) == 5
    assert all(1 <= len(flag_draw.options(s)) <= max(flag_draw.SET_SIZE) for s in sets)
    assert sets == flag_draw.draw(options, 5, seed=1) != flag_draw.draw(options, 5, seed=2)
    assert axis.expand(["auto:2", ""], lambda n: flag_draw.draw(options, n, 1)) == [*sets[:2], []]


def test_a_flag_set_splits_into_options_with_their_values():
    assert flag_draw.options(["--a", "1", "--b", "--c", "-1", "x"]) == [["--a", "1"], ["--b"], ["--c", "-1", "x"]]
    assert flag_draw.count("auto") == 3 and flag_draw.count("auto:5") == 5 and flag_draw.count("--x") is None


@pytest.mark.parametrize(
    "args, says",
    [
        (["--command", "x", "--flags-axis", "auto"], "--flags-axis auto draws from the --engine version's own help"),
        (["--engine", "0.32.0", "--flags-axis", "auto:0"], "auto:0 draws no flag set"),
    ],
)
def test_an_auto_axis_without_an_engine_or_sets_is_refused(args, says, capsys):
    from mmchaos.harness import cli

    assert cli.main(["hunt", *args]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert says in line


@pytest.mark.engine
def test_the_real_help_of_a_version_gives_the_flags_that_shape_multimodal_pooling():
    """vLLM 0.32.0's own `serve --help=all`: the options the drift depends on are among those drawn from."""
    require_engine_and_model("0.32.0")
    from mmchaos.harness.servers import engines

    by_name = {o.names[0]: o for o in flag_draw.parse(engines.require("0.32.0").serve_help())}
    assert ["--mm-processor-cache-type", "shm"] in by_name["--mm-processor-cache-type"].values()
    assert ["--mm-processor-cache-gb", "0"] in by_name["--mm-processor-cache-gb"].values()
    # a count vLLM sizes itself (its help says "default: None") is drawn small and large
    assert ["--max-num-seqs", "1"] in by_name["--max-num-seqs"].values() and "--enable-prefix-caching" in by_name
    assert not any(flag_draw.LEFT_OUT.match(n) for n in by_name) and "--port" not in by_name
