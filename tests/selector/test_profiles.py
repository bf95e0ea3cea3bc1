from __future__ import annotations

import pytest

from dl_selector.errors import UserError
from dl_selector.profiles import builtin_profiles, get_profile, load_profiles
from dl_selector.recommend import recommend


def test_builtins_are_valid_and_described():
    for p in builtin_profiles().values():
        assert p.description and p.objective


def test_platform_team_adds_and_overrides_profiles_in_toml(tmp_path):
    f = tmp_path / "team.toml"
    f.write_text('''
[profiles.team-llm]
extends = "multi-node-training"
description = "Our LLM pre-training: H100 or newer only"
min_accelerator_memory_gib = 80
nodes = 4

[profiles.dev-prototyping]
description = "Dev boxes: ARM is fine here"
architectures = ["x86_64", "arm64"]
''')
    profiles = load_profiles(f)
    team = profiles["team-llm"]
    assert team.multi_node and team.min_accelerators == 8 and team.nodes == 4 and team.source == str(f)
    rec = recommend(team)
    assert all(c.facts.accelerator_memory_gib >= 80 for c in rec.candidates)
    assert profiles["dev-prototyping"].architectures == ("x86_64", "arm64")
    assert profiles["dev-prototyping"].objective == "min_price", "an override keeps the built-in's other settings"


def test_yaml_profiles(tmp_path):
    f = tmp_path / "team.yaml"
    f.write_text("profiles:\n  cheap-infer:\n    extends: inference\n    description: cheapest\n    min_accelerator_memory_gib: 20\n")
    assert load_profiles(f)["cheap-infer"].min_accelerator_memory_gib == 20


@pytest.mark.parametrize("body,expected", [
    ('[profiles.x]\ndescription = "d"\nmin_accelerator = 2\n', "unknown setting 'min_accelerator'; closest: min_accelerators"),
    ('[profiles.x]\ndescription = "d"\nobjective = "cheapest"\n', "objective = 'cheapest'; allowed: max_throughput"),
    ('[profiles.x]\ndescription = "d"\nsdks = ["cuda", "neuorn"]\n', "sdks has 'neuorn'; allowed: cuda, neuron"),
    ('[profiles.x]\ndescription = "d"\nmin_accelerators = "eight"\n', "min_accelerators must be a whole number"),
    ('[profiles.x]\nextends = "multinode"\n', "unknown profile to extend"),
    ('[profiles.x]\nmin_accelerators = 2\n', "needs a description"),
    ('[profiles.x]\ndescription = "d"\nmin_accelerators = 4\nmax_accelerators = 2\n', "max_accelerators (2) is below"),
    ('[profiles.x]\ndescription = "d"\nnodes = 4\n', "needs multi_node = true"),
    ('profiles = 3\n', "expected a 'profiles' table"),
    ('[profiles.x\n', "not valid TOML"),
])
def test_invalid_profile_files_get_one_clear_error(tmp_path, body, expected):
    f = tmp_path / "p.toml"
    f.write_text(body)
    with pytest.raises(UserError) as e:
        load_profiles(f)
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_get_profile_unknown():
    with pytest.raises(UserError, match="closest: fp64-hpc"):
        get_profile("fp64")
