"""The tiny models by name: the recipes, resolving a name to its built folder, one-line errors for the rest."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mmchaos import paths
from mmchaos.harness.servers import model


def test_every_recipe_has_its_builder_and_its_own_folder():
    assert model.DEFAULT == "qwen3vl-embed" and model.RECIPES[model.DEFAULT].folder == paths.default_model_dir()
    assert len({r.folder for r in model.RECIPES.values()}) == len(model.RECIPES)
    for r in model.RECIPES.values():
        assert r.builder.is_file(), r.builder
    assert {r.architecture for r in model.RECIPES.values()} >= {
        "CLIPModel",
        "Qwen2VLForConditionalGeneration",
        "Qwen3VLForSequenceClassification",
    }


def test_a_name_resolves_to_its_folder_once_built_and_anything_else_passes_through(tmp_path, monkeypatch):
    monkeypatch.setenv("MMCHAOS_HOME", str(tmp_path))
    with pytest.raises(model.ModelError, match="run `mmchaos model build clip-embed`"):
        model.resolve("clip-embed")
    folder = paths.model_dir("clip-embed")
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    assert model.resolve("clip-embed") == str(folder)
    assert model.resolve("/some/folder") == "/some/folder" and model.resolve(None) is None
    with pytest.raises(model.ModelError, match="unknown model 'nope'; known: qwen3vl-embed"):
        model.recipe("nope")


@pytest.mark.integration
@pytest.mark.parametrize(
    "argv, says",
    [
        (["model", "build", "nope"], "unknown model 'nope'"),
        (["serve", "--engine", "0.32.0", "--model", "qwen3vl-rerank"], "is not built: run `mmchaos model build"),
    ],
)
def test_bad_model_names_are_one_line_errors(tmp_path, argv, says):
    env = {"MMCHAOS_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    r = subprocess.run(
        [sys.executable, "-m", "mmchaos.harness.cli", *argv], capture_output=True, text=True, timeout=60, env=env
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    [line] = r.stderr.strip().splitlines()
    assert says in line, line


def test_a_campaign_of_a_model_that_takes_an_image_alone_sends_images_alone(tmp_path):
    """Read from the model's own config.json (CLIP's architecture), so a folder of the user's counts too."""
    import json

    from mmchaos.harness.campaign import plan as campaign_plan
    from mmchaos.harness.campaign import runner as campaign_runner

    clip = tmp_path / "my-clip"
    clip.mkdir()
    (clip / "config.json").write_text(json.dumps({"architectures": ["CLIPModel"]}))
    assert not model.takes_text_with_image(str(clip)) and model.takes_text_with_image(None)
    argvs = []
    for chosen, options in ((str(clip), ""), (str(clip), "images_alone = false"), ("", "")):
        f = tmp_path / "c.toml"
        f.write_text(
            f'[campaign]\nname = "c"\ntarget = "command"\ncommand = "true {{port}}"\nmodel = "{chosen}"\n'
            f'[workload.options]\n{options}\n[[config]]\nname = "a"\n'
        )
        plan = campaign_plan.load(f)
        argvs.append(campaign_runner.locust_argv(plan, plan.configs[0], 0, tmp_path, "http://127.0.0.1:9", "m", "r"))
    assert ["--images-alone" in argv for argv in argvs] == [True, False, False]
