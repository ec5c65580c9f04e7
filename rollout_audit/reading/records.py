"""Records (dicts with contract column names) and Arrow tables in the contract's types."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import pyarrow as pa

from ..contract import schema as S
from ..contract.errors import InputError


def _meta(kind: str, fields: Sequence[pa.Field] = (), found: Mapping[bytes, bytes] | None = None) -> dict[bytes, bytes]:
    """File metadata: kind, the contract version its columns need, and a producer's
    `not_recorded`, `tokenizer` and `reward_components` declarations carried over from the table being written."""
    version = S.version_for(kind, (f.name for f in fields))
    said = (found or {}).get(S.META_VERSION, b"").decode("utf-8", "replace")
    if said in S.contract()["versions"] and S.newer(said, version):  # the producer states a later version it uses
        version = said
    meta = {S.META_VERSION: version.encode(), S.META_KIND: kind.encode()}
    declared = S.not_recorded(found, S.waivable_names())  # as written: the audit decides what it believes
    if declared:
        meta[S.META_NOT_RECORDED] = json.dumps(declared, sort_keys=True).encode()
    if (found or {}).get(S.META_TOKENIZER):  # how to decode the ids: the producer's declaration, kept as given
        meta[S.META_TOKENIZER] = found[S.META_TOKENIZER]  # type: ignore[index]
    paid = S.reward_components(found)
    if paid:
        meta[S.META_REWARD_COMPONENTS] = json.dumps(paid, sort_keys=True).encode()
    return meta


def records_to_table(records: list[Mapping], kind: str = "trajectories") -> pa.Table:
    """Records (dicts with contract column names) as an Arrow table with contract types."""
    return pa.Table.from_pylist(list(records), schema=schema_for_records(list(records), kind))


def schema_for_records(records: list[Mapping], kind: str) -> pa.Schema:
    """Contract schema restricted to the columns (and turn fields) the producer supplies."""
    present = set().union(*(r.keys() for r in records))
    unknown = sorted(present - {c.name for c in S.columns(kind)})
    if unknown:
        raise InputError(f"unknown column(s) {unknown} for {kind}; see `rollout-audit schema`")
    fields = []
    for c in S.columns(kind):
        if c.name not in present:
            continue
        if c.name == "turns":
            keys = set()
            for r in records:
                for t in r.get("turns") or ():
                    keys.update(t.keys())
            tf = [pa.field(tc.name, tc.arrow_type) for tc in S.columns("turn") if tc.name in keys]
            bad = sorted(keys - {tc.name for tc in S.columns("turn")})
            if bad:
                raise InputError(f"unknown turn field(s) {bad}; see `rollout-audit schema`")
            fields.append(pa.field("turns", pa.list_(pa.struct(tf))))
        else:
            fields.append(pa.field(c.name, c.arrow_type))
    return pa.schema(fields, metadata=_meta(kind, fields))


def canonical_schema(found: pa.Schema, kind: str) -> pa.Schema:
    """Contract types for the columns of an Arrow table (unknown columns refused)."""
    spec = {c.name: c for c in S.columns(kind)}
    fields = []
    for f in found:
        if f.name not in spec:
            raise InputError(f"unknown column {f.name!r} for {kind}; see `rollout-audit schema`")
        if f.name == "turns" and pa.types.is_list(f.type) and pa.types.is_struct(f.type.value_type):
            tspec = {c.name: c for c in S.columns("turn")}
            tf = [pa.field(x.name, tspec[x.name].arrow_type) for x in f.type.value_type if x.name in tspec]
            fields.append(pa.field("turns", pa.list_(pa.struct(tf))))
        else:
            fields.append(pa.field(f.name, spec[f.name].arrow_type))
    return pa.schema(fields, metadata=_meta(kind, fields, found.metadata))
