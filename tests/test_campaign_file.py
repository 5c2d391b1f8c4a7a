"""Campaign files are read by one set of models (mmchaos/campaign_file.py): their errors stay one line with the file,
the line and a hint; their JSON Schema is what `mmchaos campaign schema` prints and what the shipped files name."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import jsonschema
import pytest

from mmchaos import campaign_file
from mmchaos.harness import cli
from mmchaos.harness.campaign import plan as campaign_plan
from mmchaos.harness.campaign.plan import CampaignError
from mmchaos.options import did_you_mean

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted((ROOT / "campaigns").glob("*.toml"))
HEAD = '[campaign]\nname = "c"\ntarget = "attach"\nurl = "http://127.0.0.1:1"\n'
CONFIG = '\n[[config]]\nname = "a"\n'


def _load(tmp_path: Path, text: str):
    f = tmp_path / "c.toml"
    f.write_text(text)
    return f, campaign_plan.load(f, check_flags=False)


@pytest.mark.parametrize(
    "body, line, says",
    [
        ("[workload]\nusers = 2\nuserz = 3\n", 7, "unknown key 'userz' in [workload]; did you mean 'users'?"),
        ("[workload]\nduration = 0\n", 6, "duration must be at least 1 s, not 0"),
        ("[workload]\nduration = true\n", 6, "'duration' must be int or float, not bool"),
        ('[workload]\nshape = "stedy"\n', 6, "shape 'stedy' unknown; did you mean 'steady'?"),
        ("[workload]\nprocesses = 2000\n", 6, "processes must be 0 to 1024, not 2000"),
        ("[workload.mix]\nabrt = 1\n", 6, "unknown kind 'abrt' in [workload.mix]; did you mean 'abort'?"),
        ("[workload.mix]\nabort = -1\n", 6, "[workload.mix] abort must be at least 0, not -1"),
        ('[workload.options]\nzipf = "x"\n', 6, "[workload.options] zipf must be a number, not 'x'"),
        ("[workload.options]\nzip = 1\n", 6, "unknown option 'zip' in [workload.options]; did you mean 'zipf'?"),
        ('[crash]\npolicy = "restrat"\n', 6, "policy 'restrat' unknown; did you mean 'restart'?"),
        ("[crash]\nhang_after = 0\n", 6, "hang_after must be positive (seconds), not 0"),
        ("[swep]\nusers = [1]\n", 5, "unknown section [swep]; did you mean 'sweep'?"),
    ],
)
def test_a_bad_key_is_one_line_with_its_line_and_a_hint(tmp_path, body, line, says):
    f = tmp_path / "c.toml"
    f.write_text(HEAD + body + CONFIG)
    with pytest.raises(CampaignError) as e:
        campaign_plan.load(f, check_flags=False)
    assert str(e.value) == f"{f}:{line}: {says}"


def test_the_nth_config_table_is_named_by_its_line(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text(HEAD + CONFIG + '\n[[config]]\nname = "b"\nflags = ["--x", 1]\n')
    with pytest.raises(CampaignError) as e:
        campaign_plan.load(f, check_flags=False)
    assert str(e.value) == f'{f}:11: flags must be strings, e.g. ["--mm-processor-cache-gb", "0"]'
    f.write_text(HEAD + '\n[[config]]\nname = "a b"\n')
    with pytest.raises(CampaignError, match=r":7: name 'a b' must be letters, digits, \. _ - @$"):
        campaign_plan.load(f, check_flags=False)


def test_values_keep_the_type_they_were_written_in(tmp_path):
    _, plan = _load(tmp_path, HEAD + "[workload]\nspawn_rate = 2\nduration = 2.5\n[workload.mix]\nabort = 0\n" + CONFIG)
    assert plan.workload.spawn_rate == 2 and isinstance(plan.workload.spawn_rate, int)
    assert plan.workload.duration == 2.5
    assert plan.workload.mix == {"abort": 0} and plan.workload.options == {}  # only what the file set
    assert plan.workload.users == campaign_file.Workload.model_fields["users"].default


def test_the_shipped_schema_is_the_one_the_command_prints_and_every_shipped_file_names_and_meets_it(capsys):
    assert cli.main(["campaign", "schema"]) == 0
    printed = capsys.readouterr().out
    shipped = ROOT / "campaigns" / campaign_file.SCHEMA_FILE
    assert shipped.read_text() == printed, "run: mmchaos campaign schema > campaigns/campaign.schema.json"
    schema = json.loads(printed)
    jsonschema.Draft202012Validator.check_schema(schema)
    for f in SHIPPED:
        assert f.read_text().splitlines()[0] == f"#:schema ./{campaign_file.SCHEMA_FILE}", f
        jsonschema.validate(tomllib.loads(f.read_text()), schema)


def test_the_schema_rejects_what_the_loader_rejects():
    schema = campaign_file.json_schema()
    good = {"campaign": {"name": "c"}, "config": [{"name": "a"}]}
    jsonschema.validate(good, schema)
    for bad in (
        {**good, "workload": {"userz": 1}},
        {**good, "workload": {"duration": 0}},
        {**good, "workload": {"mix": {"abort": -1}}},
        {**good, "crash": {"policy": "x"}},
        {"campaign": {"name": "c"}, "config": []},
        {**good, "workload": {"options": {"zip": 1}}},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
        with pytest.raises(campaign_file.FileProblem):
            campaign_file.validate(bad)


def test_an_unknown_name_among_hundreds_gets_the_closest_few_not_all_of_them():
    flags = ["--max-model-len", "--mm-processor-cache-gb", "--mm-processor-cache-type"] + [
        f"--other-flag-{i}" for i in range(400)
    ]
    assert did_you_mean("--mm-processor-cache", flags) == "did you mean '--mm-processor-cache-gb'?"
    hint = did_you_mean("--cache-mm-gb", flags)
    assert hint.startswith(f"closest of {len(flags)} known: --mm-processor-cache-gb") and hint.count(",") <= 2, hint
    assert did_you_mean("--zzzzzzzzzzzzzzzzzzzzzzzz", flags) == f"none of the {len(flags)} known is close"
    assert did_you_mean("sawtooth", ["steady", "ramp"]) == "known: steady, ramp"  # a few: all of them


def test_an_option_is_checked_as_it_is_defined_and_the_table_as_a_whole():
    """The knobs every campaign key and Locust flag come from are a model too: a default that is no value of its
    own, a type no flag takes, choices on a number, a name twice or a name the harness relies on missing is
    refused where the table is written, not when a user first sets the knob."""
    from pydantic import ValidationError

    from mmchaos.options import BY_NAME, OPTIONS, Option, OptionTable

    knob = BY_NAME["pool_size"]
    assert Option("pool_size", int, 48, knob.help, minimum=1) == knob and knob.flag == "--pool-size"
    assert Option("rate", float, 0.0, "open loop", positive=True).default == 0  # 0: not given
    for kwargs, says in [
        ({"minimum": 1}, "its default must be at least 1, not 0"),
        ({"choices": (0, 1)}, "choices are for text options"),
        ({"minimum": 2, "maximum": 1}, "minimum 2 is above maximum 1"),
        ({"colour": "red"}, "colour"),
    ]:
        with pytest.raises(ValidationError, match=says):
            Option("knob", int, 0, "a knob", **kwargs)
    with pytest.raises(ValidationError, match="must be one of int, float, str, bool, not list"):
        Option("knob", list, [], "a knob")
    with pytest.raises(ValidationError, match="options defined twice: pool_size"):
        OptionTable(options=[*OPTIONS, BY_NAME["pool_size"]], named=frozenset())
    with pytest.raises(ValidationError, match="options named but not defined: nope"):
        OptionTable(options=OPTIONS, named=frozenset({"nope", "seed"}))
