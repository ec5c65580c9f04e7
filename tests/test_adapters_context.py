"""One context schema for every adapter (rollout_audit.adapters.base.context_values): through the
CLI, an unknown `--context` key and a value of the wrong type are exit 2 with one line naming the
key, whichever framework converts the dump."""

from __future__ import annotations

import json

import pytest
from adapterhelp import cli, fixture

from rollout_audit.adapters import NAMES
from rollout_audit.adapters.base import AdapterError, context_values


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(("pair", "key"), [("bogus=1", "bogus"), ("temperature=hot", "temperature")])
def test_unknown_key_or_bad_value_exits_2_naming_the_key(name, pair, key):
    res = cli("check", "--from", name, fixture(name, "compliant"), "--context", pair)
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and key in lines[0] and "Traceback" not in res.output, res.output


@pytest.mark.parametrize(
    ("context", "allowed", "expected"),
    [
        ({"temperature": "0.7", "reset_seed": "3"}, (), {"temperature": 0.7, "reset_seed": 3}),
        ({"reward_key": "acc"}, ("reward_key",), {"reward_key": "acc"}),
        ({"flag": "true", "other": "0"}, {"flag": bool, "other": bool}, {"flag": True, "other": False}),
        ({"flag": False, "n": 4}, {"flag": bool, "n": int}, {"flag": False, "n": 4}),
    ],
)
def test_values_arrive_in_their_types(context, allowed, expected):
    assert context_values(context, allowed) == expected


@pytest.mark.parametrize(
    ("context", "allowed"),
    [
        ({"temperature": "nan"}, ()),
        ({"temperature": "inf"}, ()),
        ({"reset_seed": "1.5"}, ()),
        ({"reset_seed": True}, ()),
        ({"reset_seed": 2.5}, ()),
        ({"flag": "maybe"}, {"flag": bool}),
        ({"environment_id": ["a"]}, ()),
    ],
)
def test_bad_values_name_their_key(context, allowed):
    with pytest.raises(AdapterError, match=next(iter(context))):
        context_values(context, allowed)


@pytest.mark.parametrize("name", NAMES)
def test_e801_on_a_dump_names_the_context_that_supplies_the_missing_identity(name):
    """A dump that records no environment identity: E801 says which `--context KEY=VALUE` gives each
    missing one, and with those options the same dump passes E801."""
    res = cli("check", "--from", name, fixture(name, "compliant"), "--select", "E801", "--format", "json")
    assert res.exit_code == 1, res.output

    (found,) = json.loads(res.stdout)["findings"]
    hint = "pass --context environment_version=... --context verifier_version=... --context reset_seed=..."
    assert found["code"] == "E801" and found["message"].endswith(hint), found
    given = ["--context", "environment_version=1", "--context", "verifier_version=2", "--context", "reset_seed=0"]
    res = cli("check", "--from", name, fixture(name, "compliant"), "--select", "E801", *given)
    assert res.exit_code == 0, res.output
    res = cli("check", "--from", name, fixture(name, "compliant"), "--select", "E801", *given[:4])
    assert res.exit_code == 1 and res.stdout.count("--context") == 1 and "--context reset_seed=..." in res.stdout
