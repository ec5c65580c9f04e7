"""A newcomer's check: one function, its fault, and `python -m rollout_audit.dev generate`.

A module outside the package registers M199 and its fault through the public decorators, in a
subprocess (the registries are per process, so nothing leaks into other tests). The generate
command rewrites a copy of every derived file, and the whole machinery accepts the new check:
the runner runs it (silent on the compliant log, firing on its fault, not run without its
input), `explain` prints it, docs/checks.md and the README count it, the manifest and the
detection matrix carry its fault, the fault joins the groups, and no derived file is stale.
"""

from __future__ import annotations

from pathlib import Path

from conftest import generate_on_a_copy

ROOT = Path(__file__).resolve().parent.parent

NEW_CHECK = '''
import polars as pl

from rollout_audit.contract.registry import rule
from rollout_audit.faults import fault


@rule("M199", "turn sampled above temperature 10", "warning", requires=("turns.temperature",))
def too_hot(b, cfg):
    """A turn records a sampling temperature above 10.

    No agent policy samples that hot: the value is a unit error of the collector. Fix the
    collector to record the engine's temperature.
    """
    bad = b.turns.filter(pl.col("temperature") > 10)
    return bad.select("trajectory_id", pl.col("_t").alias("turn"), pl.format("temperature {}", "temperature").alias("message"))


@fault("temperature_in_percent", {"M199"})
def temperature_in_percent(ctx):
    """The collector recorded one turn's temperature in percent."""
    t = ctx.pick(lambda t: bool(t["turns"]))
    t["turns"][0]["temperature"] = 100.0 * (t["turns"][0]["temperature"] or 1.0)
    return [t["trajectory_id"]]
'''

SCRIPT = """
import importlib.util, json, sys
from pathlib import Path

import polars as pl
from click.testing import CliRunner

root, module = Path(sys.argv[1]), sys.argv[2]
spec = importlib.util.spec_from_file_location("newcheck", module)
spec.loader.exec_module(importlib.util.module_from_spec(spec))

import rollout_audit as ra
from rollout_audit.cli import main
from rollout_audit.dev.generate import generate, stale
from rollout_audit.faults import FAULTS, groups, read_records

generate(root)
out = {"stale": stale(root)}
out["explain"] = CliRunner().invoke(main, ["explain", "M199"]).stdout
out["docs"] = "### M199 (warning): turn sampled above temperature 10" in (root / "docs" / "checks.md").read_text()
guide = (root / "docs" / "guide" / "checks-and-evidence.md").read_text()
counts = guide.split("<!-- generated: checks -->")[1].split("<!-- end generated -->")[0]
out["readme"] = f"{len(ra.all_rules())} checks in nine families" in counts and ", M199)" in counts
manifest = json.loads((root / "fixtures" / "manifest.json").read_text())
out["manifest"] = manifest["faults"]["temperature_in_percent"]
out["matrix"] = "| temperature_in_percent | M199 | M199 | yes | yes | - |" in (root / "fixtures" / "README.md").read_text()
out["groups"] = ["temperature_in_percent"] in [list(g) for g in groups()]
clean = ra.audit(root / "fixtures" / "compliant")
out["clean"] = [clean.findings.filter(pl.col("code") == "M199").height, "M199" in clean.not_run]
broken = ra.audit(root / "fixtures" / "broken" / "temperature_in_percent")
serious = broken.findings.filter(pl.col("severity") != "info")
out["broken"] = sorted(set(serious["code"])), serious["trajectory_id"].to_list()
trajs, ups = read_records(root / "fixtures" / "compliant")
for t in trajs:
    for tr in t["turns"]:
        tr.pop("temperature")
out["without_input"] = ra.audit(trajs, ups, select=["M1"]).not_run.get("M199")
print(json.dumps(out))
"""


def test_a_new_check_and_its_fault_need_only_the_generate_command(tmp_path):
    res = generate_on_a_copy(tmp_path, SCRIPT, NEW_CHECK)
    assert res.returncode == 0, res.stderr[-3000:]
    import json

    out = json.loads(res.stdout.splitlines()[-1])
    assert out["stale"] == []
    assert out["explain"].startswith("M199 (warning): turn sampled above temperature 10")
    assert "unit error of the collector" in out["explain"]
    assert out["docs"] and out["readme"] and out["matrix"] and out["groups"]
    entry = out["manifest"]
    assert entry["codes"] == ["M199"] and len(entry["touched"]) == 1
    assert out["clean"] == [0, False]
    codes, named = out["broken"]
    assert codes == ["M199"] and named == entry["touched"]
    assert out["without_input"] == "column turns.temperature absent"
    # the committed files are untouched
    assert "M199" not in (ROOT / "docs" / "checks.md").read_text()
