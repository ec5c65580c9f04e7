"""SkyRL adapter: the compliant fixture audits clean with the not-run list docs/frameworks/skyrl.md
predicts; SkyRL#758 (appended EOS, mask 1, log-prob 0.0) is L208; the CLI paths agree."""

from __future__ import annotations

from adapterhelp import (
    audit,
    cli,
    context_args,
    convert_then_check_equals_check_from,
    documented_not_run,
    fixture,
    missing_field_exits_2,
)


def test_compliant_is_clean_and_not_run_as_documented():
    rep = audit("skyrl", "compliant")
    assert rep.findings.is_empty(), rep.render()
    assert set(rep.not_run) == documented_not_run("skyrl")


def test_appended_eos_with_zero_logprob_is_l208(tmp_path):
    found = convert_then_check_equals_check_from("skyrl", "eos_appended_logprob_zero", tmp_path)
    assert [(f[0], f[1]) for f in found] == [("L208", "search-4_1")]


def test_missing_loss_masks_exits_2_naming_it(tmp_path):
    line = missing_field_exits_2("skyrl", "compliant", "loss_masks", tmp_path)
    assert "gsm8k-17_1" in line


def test_convert_writes_next_to_the_dump_into_a_new_directory_only(tmp_path):
    dump = tmp_path / "skyrl.jsonl"
    dump.write_text(fixture("skyrl", "compliant").read_text())
    assert cli("convert", "--from", "skyrl", dump, tmp_path / "log", *context_args()).exit_code == 0
    again = cli("convert", "--from", "skyrl", dump, tmp_path / "log", *context_args())
    assert again.exit_code == 2 and "not empty" in again.stderr


def test_unknown_context_exits_2_naming_it():
    result = cli("check", "--from", "skyrl", fixture("skyrl", "compliant"), "--context", "seed=3")
    assert result.exit_code == 2 and "unknown context 'seed'" in result.stderr
