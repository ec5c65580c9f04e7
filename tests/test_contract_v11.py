"""Contract 1.1 file metadata: `rollout_log.not_recorded` turns an absent column into a
not-run reason (never an S001), survives RolloutWriter, and a hostile value is ignored."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

import rollout_audit as ra
from rollout_audit.contract import schema as S
from rollout_audit.contract.config import Config
from rollout_audit.reading.records import records_to_table

WHY = "FakeTrainer does not record behaviour log-probs"


def _without_logprobs(trajs, meta: bytes | None) -> pa.Table:
    t = records_to_table(trajs).drop_columns(["behavior_logprobs"])
    extra = {S.META_NOT_RECORDED: meta} if meta is not None else {}
    return t.replace_schema_metadata({**(t.schema.metadata or {}), **extra})


def test_declared_column_is_not_run_with_the_reason(records):
    trajs, ups = records
    rep = ra.audit(_without_logprobs(trajs, json.dumps({"behavior_logprobs": WHY}).encode()), ups)
    assert "S001" not in rep.codes()
    assert rep.not_run["L201"] == WHY and rep.not_run["L203"] == WHY
    assert "M101" not in rep.not_run and rep.summary["tokens_read"] > 0  # token checks still run without log-probs


def test_undeclared_or_hostile_metadata_leaves_s001(records):
    trajs, ups = records
    for meta in (None, b"{not json", b'["behavior_logprobs"]', json.dumps({"behavior_logprobs": 3}).encode()):
        rep = ra.audit(_without_logprobs(trajs, meta), ups)
        assert "S001" in rep.codes() and rep.not_run["L201"] == "column behavior_logprobs absent"


def test_writer_keeps_the_declaration_and_states_the_version(records, tmp_path):
    trajs, ups = records
    table = _without_logprobs(trajs, json.dumps({"behavior_logprobs": WHY}).encode())
    with ra.RolloutWriter(tmp_path / "t.parquet", validate=False) as w:
        w.write(table)
    with ra.RolloutWriter(tmp_path / "updates" / "u.parquet", "updates") as w:
        w.write([{**ups[0], "denominator_scale": 1.0}])
    meta = pq.read_schema(tmp_path / "t.parquet").metadata
    assert json.loads(meta[S.META_NOT_RECORDED]) == {"behavior_logprobs": WHY}
    assert meta[S.META_VERSION] == b"1"  # no 1.1 column
    assert pq.read_schema(tmp_path / "updates" / "u.parquet").metadata[S.META_VERSION] == b"1.1"
    own = ra.audit(tmp_path)  # a file on disk does not waive a required column on its own word
    assert "S001" in own.codes() and own.exit_code() == 1
    assert ra.audit(tmp_path, config=Config(not_recorded=["behavior_logprobs"])).not_run["L201"] == WHY
