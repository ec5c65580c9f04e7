"""TRL's `RLOOTrainer` under `AuditedRLOOTrainer`: real RLOO steps on the tiny CPU model of
test_integration_trl (nothing downloaded), one optimizer step each (a few seconds). The compliant run
is docs/frameworks/trl.md's "Set these options" snippet, executed as the page writes it, and its log is
audited with the page's command; the fault is an `RLOOTrainer` whose baseline includes the sample itself."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shlex
import warnings
from pathlib import Path

import pyarrow.parquet as pq
import pytest

trl = pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from adapterhelp import cli  # noqa: E402
from test_integration_trl import _dataset, _model, _settings, _tokenizer  # noqa: E402

import rollout_audit.integrations.trl as integration  # noqa: E402
from rollout_audit.contract.errors import AuditFailed  # noqa: E402
from rollout_audit.integrations.trl import AuditedRLOOTrainer, _Guard  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "frameworks" / "trl.md"
NOT_RECORDED = '[tool.rollout-audit]\nnot_recorded = ["behavior_logprobs"]\n'  # RLOO keeps no behaviour log-probs


def _length_reward(completions, **kwargs):
    """The reply's length in characters: varies within a group even on this untrained model."""
    return [float(len(c[0]["content"])) for c in completions]


# what the tests add to the user's RLOOConfig: one small CPU step; the page's own keywords win
SMALL = {
    "per_device_train_batch_size": 4,
    "num_generations": 4,
    "max_completion_length": 6,
    "learning_rate": 1e-3,
    "temperature": 0.7,
    "report_to": "none",
    "use_cpu": True,
    "bf16": False,
    "save_strategy": "no",
    "logging_steps": 1,
    "seed": 0,
    "disable_tqdm": True,
    "dataloader_num_workers": 0,
    "max_steps": 1,
}


def _config(**kw):
    return trl.RLOOConfig(**{**SMALL, **kw})


def _rloo(out: Path, cls: type = AuditedRLOOTrainer, model=None, **kw):
    """One RLOO step of `cls` writing its log to out/log."""
    torch.set_num_threads(1)
    tok = _tokenizer()
    audit = kw.pop("audit", None) or _settings(log_dir=out / "log")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = cls(
            model=model if model is not None else _model(tok, stop_every=6),
            reward_funcs=_length_reward,
            args=_config(output_dir=str(out / "out"), **kw),
            train_dataset=_dataset(4),
            processing_class=tok,
            audit=audit,
        )
        trainer.train()
    return trainer


def _section() -> str:
    return PAGE.read_text().split("## Set these options", 1)[1].split("\n## ", 1)[0]


def _codes(text: str) -> set[str]:
    """The check codes a page's prose names, ranges (S001-S005) expanded."""
    out: set[str] = set()
    for a, b in re.findall(r"\b([A-Z]\d{3})(?:-([A-Z]\d{3}))?\b", text):
        out |= {f"{a[0]}{k:03d}" for k in range(int(a[1:]), int((b or a)[1:]) + 1)}
    return out


@contextlib.contextmanager
def _in(path: Path):
    here = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(here)


@pytest.fixture(scope="module")
def page_run(tmp_path_factory):
    """The page's snippet, as written, with the test's model, reward and data (and SMALL in RLOOConfig)."""
    tmp = tmp_path_factory.mktemp("rloo_page")
    python = re.search(r"```python\n(.*?)```", _section(), flags=re.S).group(1)
    tok = _tokenizer()
    torch.set_num_threads(1)
    ns = {
        "model": _model(tok, stop_every=6),
        "reward": _length_reward,
        "data": _dataset(4),
        "tok": tok,
        "RLOOConfig": functools.partial(_config),
    }
    with _in(tmp), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(python, ns)  # the page's own lines: imports, the trainer, trainer.train()
    return tmp, ns["trainer"]


def _check(*args) -> tuple[int, dict]:
    res = cli("check", *args, "--format", "json")
    assert res.exit_code in (0, 1), res.output
    return res.exit_code, json.loads(res.stdout)


def test_the_pages_snippet_is_a_compliant_rloo_run_that_audits_clean_with_its_advantages_recomputed(page_run):
    tmp, trainer = page_run
    assert isinstance(trainer, AuditedRLOOTrainer) and trainer.beta == 0.0
    labels = [label for label, _ in trainer.audit_reports]
    assert labels[0].startswith("gen") and any(label.startswith("update") for label in labels)
    for label, rep in trainer.audit_reports:
        assert rep.ok and rep.findings.height == 0, (label, rep.findings)
    for label, rep in trainer.audit_reports:
        if label.startswith("update"):
            assert not {"U601", "U602", "U603", "U604", "U605", "U606", "P503"} & set(rep.not_run), rep.not_run
    assert trainer.audit_reports[0][1].not_run["L201"].startswith("RLOOTrainer keeps no per-token log-probs")
    said = (tmp / "audit-log" / "pyproject.toml").read_text().splitlines()[1]  # RLOO's settings, as read
    assert said.startswith("# RLOOConfig as the trainer read it: num_generations=4,") and "beta=0.0," in said


def test_the_pages_command_audits_the_pages_log_clean(page_run):
    tmp, _ = page_run
    toml = re.search(r"```toml\n(.*?)```", _section(), flags=re.S).group(1)
    assert toml == NOT_RECORDED
    command = next(ln.strip() for ln in _section().splitlines() if ln.strip().startswith("rollout-audit check"))
    args = shlex.split(command)[2:]
    (tmp / args[args.index("--config") + 1]).write_text(toml)  # the user's file, as the page names it
    with _in(tmp):
        code, rep = _check(*args)
    assert (code, rep["findings"]) == (0, [])
    ran = set(rep["summary"]["checks_run"])
    listed = PAGE.read_text().split("**Rules that run on RLOO**", 1)[1].split("On the", 1)[0]
    assert _codes(listed) == ran  # the page's list of what runs is what ran
    not_run = {n["code"]: n["reason"] for n in rep["not_run"]}
    assert not {"U601", "U603", "U604", "U606", "M101", "T304"} & set(not_run)
    assert "RLOOTrainer keeps no per-token log-probs" in not_run["L203"]
    assert "takes no rollout_func" in not_run["M106"]


class _SelfInBaseline(trl.RLOOTrainer):
    """An RLOO whose baseline includes the sample itself (the group mean): what a leave-one-out bug trains."""

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        k = self.num_generations
        # RLOO's A_i = r_i - mean_{j≠i} r_j = k/(k-1) (r_i - mean r); the group-mean baseline is (k-1)/k of it
        out["advantages"] = out["advantages"] * (k - 1) / k
        return out


class _AuditedSelfInBaseline(AuditedRLOOTrainer, _SelfInBaseline):
    """The guard over the faulty trainer (method order: the guard, then the fault, then RLOOTrainer)."""


@pytest.fixture(scope="module")
def fault_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rloo_fault")
    return tmp, _rloo(tmp, _AuditedSelfInBaseline, beta=0.0)


def test_rloo_with_the_sample_in_its_own_baseline_is_u603_on_each_completion_it_moves(fault_run):
    tmp, trainer = fault_run
    assert type(trainer).__mro__[1:4] == (AuditedRLOOTrainer, _Guard, _SelfInBaseline)  # the guard sees the fault
    gen = trainer.audit_reports[0][1]
    assert gen.ok  # the batch itself is fine: the fault is in the advantages
    updates = [rep for label, rep in trainer.audit_reports if label.startswith("update")]
    found = {(r["code"], r["trajectory_id"]) for rep in updates for r in rep.findings.iter_rows(named=True)}
    (tmp / "user.toml").write_text(NOT_RECORDED)
    code, rep = _check(tmp / "log", "--config", tmp / "user.toml")
    assert code == 1
    on_disk = {(f["code"], f["trajectory_id"]) for f in rep["findings"]}
    assert on_disk == found and {c for c, _ in found} == {"U603"}
    # exactly the completions whose advantage the fault moved: those RLOO gives a non-zero one
    upd = pq.read_table(next((tmp / "log" / "updates").glob("*.parquet"))).to_pylist()[0]
    moved = {t for t, a in zip(upd["trajectory_ids"], upd["advantages"]) if abs(a) > 1e-6}
    assert moved and {t for _, t in found} == moved


def test_raise_stops_the_faulty_rloo_before_its_step(tmp_path):
    with pytest.raises(AuditFailed, match="U603"):
        _rloo(tmp_path, _AuditedSelfInBaseline, beta=0.0, audit=_settings(on_finding="raise"))


def test_rloos_default_kl_in_the_reward_is_said_and_u603_is_not_run_with_that_reason(tmp_path):
    """RLOOConfig's default beta=0.05 (a reference model: RLOO loads it from the model's path)."""
    tok = _tokenizer()
    path = tmp_path / "model"
    _model(tok, stop_every=6).save_pretrained(path)
    tok.save_pretrained(path)
    trainer = _rloo(tmp_path, model=str(path))
    assert trainer.beta == 0.05  # RLOO's own default, not the test's
    update = next(rep for label, rep in trainer.audit_reports if label.startswith("update"))
    assert update.ok
    assert update.not_run["U603"].startswith("RLOOConfig beta=0.05: a KL penalty")
    (tmp_path / "user.toml").write_text(NOT_RECORDED)
    code, rep = _check(tmp_path / "log", "--config", tmp_path / "user.toml")
    assert code == 0
    reasons = {n["code"]: n["reason"] for n in rep["not_run"]}
    assert reasons["U603"].startswith("RLOOConfig beta=0.05: a KL penalty")  # said in the written record


def test_normalised_rloo_advantages_are_named_not_recomputed(tmp_path):
    trainer = _rloo(tmp_path, beta=0.0, normalize_advantages=True)
    update = next(rep for label, rep in trainer.audit_reports if label.startswith("update"))
    assert update.ok and "normalize_advantages=True" in update.not_run["U603"]


def test_a_trl_outside_the_tested_range_is_one_warning(monkeypatch, tmp_path):
    monkeypatch.setattr(trl, "__version__", "1.17.0")
    monkeypatch.setattr(integration, "_warned", False)
    tok = _tokenizer()

    def build():
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            AuditedRLOOTrainer(
                model=_model(tok),
                reward_funcs=_length_reward,
                args=_config(output_dir=str(tmp_path), beta=0.0),
                train_dataset=_dataset(4),
                processing_class=tok,
            )
        return [str(w.message) for w in seen if "outside the tested range" in str(w.message)]

    assert build() == [
        "rollout-audit: trl 1.17.0 is outside the tested range (1.16.0); the trainer's batch may have changed: "
        "check the audit's not-run list for what was not recorded"
    ]
    assert build() == []  # once per process
    assert integration.version_warning(trl.__version__) is not None
    assert integration.version_warning("1.16.0") is None
