"""prime-rl's trainer batches (`{output_dir}/rollouts/step_{N}/rank_{r}.bin`, prime-rl 559b447) joined to
the verifiers traces they were built from, as contract trajectories of what the trainer trained.

The filesystem transport writes each data rank's `list[MicroBatch]` with msgspec's msgpack encoder
(`src/prime_rl/transports/rollouts/filesystem.py:29-35`, `base.py:15`). `MicroBatch` is an array-like
struct (`transports/rollouts/types.py:74-99`): its fields are positional, in this order, and trailing
defaults are omitted (`omit_defaults=True`): input_ids, loss_mask, advantages, inference_logprobs,
position_ids, sequence_lengths, temperatures, env_names, seq_lens, then the optional ref_logprobs,
routed_experts, mm_kwargs, mm_token_type_ids, rl_weights, ce_weights, ref_kl_weights. A micro batch packs
samples back to back (`trainer/batch.py:540-617`): `sequence_lengths` is each sample's length, and the
padding to a multiple is appended to the last one with its `position_ids` restarting at 0
(`batch.py:700-731`), so a sample ends where its position ids restart.

A batch carries no provenance (its `loss_mask` is the sample's `mask`, `batch.py:345-353`), no reward
and no stop cause: those come from the verifiers traces (`verifiers` adapter, v1 `Trace` records) in the
same dump, each trainer sample joined to the trace branch with the same token ids. The trajectory is the
branch with the trainer's loss mask and inference log-probs: M101/M102 then judge the mask the trainer
applied against the provenance the engine recorded."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..contract import schema as S
from ..reading.records import records_to_table
from .base import (
    META_ORIGINS,
    META_TRAINER_SETTINGS,
    AdapterError,
    _regular,
    context_values,
    dump_files,
    flags,
    located,
    numbers,
    wholes,
    with_trainer_settings,
)
from .steps import guarded

# MicroBatch's positional fields at prime-rl 559b447 (transports/rollouts/types.py:77-99)
FIELDS = (
    "input_ids",
    "loss_mask",
    "advantages",
    "inference_logprobs",
    "position_ids",
    "sequence_lengths",
    "temperatures",
    "env_names",
    "seq_lens",
    "ref_logprobs",
    "routed_experts",
    "mm_kwargs",
    "mm_token_type_ids",
    "rl_weights",
    "ce_weights",
    "ref_kl_weights",
)
REQUIRED = 9  # the fields without a default
BATCH = re.compile(r"step_(\d+)[/\\]rank_(\d+)\.bin$")
KIND = "_prime_rl_sample"
# [orchestrator.algo] types at 559b447 (packages/prime-rl-configs/src/prime_rl/configs/algorithm.py:200-367)
ALGOS = (
    "grpo",
    "echo",
    "max_rl",
    "rae",
    "hierarchical_grpo",
    "opd",
    "opsd",
    "sft",
)  # the key a decoded trainer sample carries among the dump's records


def read_dump(paths: Sequence[str | os.PathLike]) -> tuple[list[Path], list[Path], list[Mapping[str, Any]]]:
    """The batch files and the trace files at `paths`: each trainer sample one record, then the traces."""
    bins: list[Path] = []
    traces: list[Path] = []
    other: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            bins += _batch_files(p)
            try:
                found, rest = dump_files(p)
            except AdapterError:
                found, rest = [], []
            traces += found
            other += [f for f in rest if f not in bins]
        elif p.name.endswith(".bin"):
            bins.append(p)
        else:
            traces.append(p)
    if not bins:
        raise AdapterError(f"{', '.join(map(str, paths))}: no rollouts/step_N/rank_r.bin batch files")
    if not traces:
        raise AdapterError(f"{', '.join(map(str, paths))}: no verifiers trace files (*.jsonl) beside the batches")
    from .base import read_records

    records: list[Mapping[str, Any]] = [s for f in bins for s in samples(f)]
    records += [r for f in traces for r in read_records(f)]
    return [*bins, *traces], other, records


def _batch_files(root: Path) -> list[Path]:
    """Every `step_N/rank_r.bin` under `root` (symlinked directories not followed, hidden ones skipped)."""
    out = []
    for d, dirs, names in os.walk(root):
        dirs[:] = sorted(x for x in dirs if not x.startswith("."))
        out += [Path(d) / n for n in sorted(names) if BATCH.search((Path(d) / n).as_posix())]
    return out


USED = 7  # the leading fields `samples` reads; the others are skipped unbuilt


class _Nested(Exception):
    """A container inside a field that holds scalars."""


def _decode(path: Path) -> list[list[Any]]:
    """The micro batches of a batch file, each its fields (None for the ones `samples` does not read).
    The array headers of the batch and its micro batches are walked, and each field is built only
    when it is flat: a container inside one stops the build at its second, so a hostile file costs
    memory in proportion to its bytes, never the ~100x that nested empty arrays decode to."""
    import msgpack  # the prime-rl extra

    size = _regular(path)
    with path.open("rb") as fh:  # read(n) allocates n bytes first: the file's size, not the cap
        data = fh.read(size + 1)
    if len(data) > size:
        raise AdapterError(f"{path}: grew while it was read (a batch file being written)")
    lists = [0]

    def flat(values: list) -> list:
        lists[0] += 1
        if lists[0] > 1:  # the field's own array is the only one, and it completes last
            raise _Nested
        return values

    def no_map(_: Any) -> Any:
        raise _Nested

    limit = max(len(data), 1)  # every element takes at least one byte
    unpacker = msgpack.Unpacker(
        raw=False,
        strict_map_key=True,
        list_hook=flat,
        object_hook=no_map,
        max_buffer_size=limit,
        max_str_len=limit,
        max_bin_len=limit,
        max_array_len=limit,
        max_map_len=limit,
        max_ext_len=limit,
    )
    unpacker.feed(data)
    out: list[list[Any]] = []
    m, field = -1, ""
    try:
        try:
            n = unpacker.read_array_header()
        except ValueError:
            raise AdapterError(
                f"{path}: a batch file holds an array of micro batches, not another msgpack value"
            ) from None
        for m in range(n):
            where = f"{path}: micro batch {m}"
            try:
                k = unpacker.read_array_header()
            except ValueError:
                k = -1
            if not REQUIRED <= k <= len(FIELDS):
                raise AdapterError(f"{where}: a MicroBatch is an array of {REQUIRED} to {len(FIELDS)} fields")
            mb: list[Any] = []
            for field in FIELDS[:k]:
                lists[0] = 0
                mb.append(unpacker.unpack() if field in FIELDS[:USED] else unpacker.skip())  # skip() is None
            out.append(mb)
            field = ""
    except AdapterError:
        raise
    except _Nested:
        raise AdapterError(
            f"{path}: micro batch {m}: {field}: a flat array of scalars, not one holding arrays or maps"
        ) from None
    except (ValueError, TypeError, msgpack.exceptions.UnpackException, RecursionError) as e:
        raise AdapterError(f"{path}: not a complete msgpack batch ({type(e).__name__}: {e})") from None
    if unpacker.tell() != len(data):
        raise AdapterError(f"{path}: bytes after the msgpack batch (not one list[MicroBatch])")
    return out


def samples(path: Path) -> list[Mapping[str, Any]]:
    """Every packed sample of a batch file, unpadded, as a record naming its step, rank, micro batch."""
    found = BATCH.search(path.as_posix())
    step, rank = (int(found.group(1)), int(found.group(2))) if found else (None, None)
    out: list[Mapping[str, Any]] = []
    for m, raw in enumerate(_decode(path)):
        where = f"{path}: micro batch {m}"
        mb = dict(zip(FIELDS, raw))
        ids = wholes(mb["input_ids"], "input_ids", where)
        mask = flags(mb["loss_mask"], "loss_mask", where)
        lps = numbers(mb["inference_logprobs"], "inference_logprobs", where)
        adv = numbers(mb["advantages"], "advantages", where)
        pos = wholes(mb["position_ids"], "position_ids", where)
        temps = numbers(mb["temperatures"], "temperatures", where)
        lengths = wholes(mb["sequence_lengths"], "sequence_lengths", where)
        sizes = {
            "loss_mask": len(mask),
            "inference_logprobs": len(lps),
            "advantages": len(adv),
            "position_ids": len(pos),
            "temperatures": len(temps),
        }
        for name, n in sizes.items():
            if n != len(ids):
                raise AdapterError(f"{where}: {name}: {n} values for {len(ids)} input_ids")
        if sum(lengths) != len(ids) or any(n <= 0 for n in lengths):
            raise AdapterError(f"{where}: sequence_lengths: {sum(lengths)} tokens in all, {len(ids)} input_ids")
        zeros = np.flatnonzero(np.asarray(pos, dtype=object) == 0)  # where position ids restart
        start = 0
        for k, n in enumerate(lengths):
            end = start + n
            later = zeros[(zeros > start) & (zeros < end)]
            restart = int(later[0]) if later.size else end  # the padding's own 0
            rec = {
                KIND: True,
                "step": step,
                "rank": rank,
                "micro_batch": m,
                "sample": k,
                "input_ids": ids[start:restart],
                "loss_mask": mask[start:restart],
                "inference_logprobs": lps[start:restart],
                "advantages": adv[start:restart],
                "temperatures": temps[start:restart],
                "padding_trained": any(mask[restart:end]),
            }
            out.append(located(rec, f"{where} sample {k}"))
            start = end
    return out


# prime-rl's [orchestrator.algo] type, as context (its configuration is not in the batch): the
# algorithms whose credit is GRPO's reward minus the group mean (configs/algorithm.py:200-225,
# orchestrator/algo/grpo.py:25-45), without a length penalty
OWN_CONTEXT = {"algo": str}
GROUP_MEAN_ALGOS = ("grpo", "echo")
UPDATE_LACKS = {
    **{
        k: "prime-rl's batch records no loss reduction nor denominator (each loss component is normalised "
        "by its own global token count, computed in the trainer)"
        for c in ("reduction", "loss_denominator")
        for k in (c, f"updates.{c}")
    },
    **{
        k: "prime-rl's batch does not say which weights the trainer starts the step from"
        for k in ("trainer_version", "updates.trainer_version")
    },
}


def _join(records: Iterable[Mapping[str, Any]], context: dict[str, Any]) -> tuple[pa.Table, list[int], list]:
    """The verifiers trace table, the row of each trainer sample in it, and the samples: each sample
    joined to the trace branch with its token ids (branches with the same ids in the order read)."""
    from . import verifiers

    context.setdefault("trainer", "prime-rl")
    trained: list[Mapping[str, Any]] = []
    traces: list[Mapping[str, Any]] = []
    for rec in records:
        (trained if rec.get(KIND) else traces).append(rec)
    table = verifiers.to_contract(traces, **{k: v for k, v in context.items() if k not in OWN_CONTEXT})
    by_ids: dict[tuple[int, ...], list[int]] = {}
    for i, seq in enumerate(table.column("token_ids").to_pylist()):
        by_ids.setdefault(tuple(seq), []).append(i)
    rows: list[int] = []
    taken: set[int] = set()
    for s in trained:
        at = getattr(s, "origin", None) or "a trainer sample"
        if s["padding_trained"]:
            raise AdapterError(f"{at}: loss_mask: true on the padding after the sample")
        same = by_ids.get(tuple(s["input_ids"]))
        if not same:
            raise AdapterError(f"{at}: input_ids: {len(s['input_ids'])} tokens that no verifiers trace branch has")
        free = [i for i in same if i not in taken]
        if not free:
            raise AdapterError(f"{at}: input_ids: every trace branch with these tokens is already trained")
        taken.add(free[0])
        rows.append(free[0])
    if not rows:
        raise AdapterError("no trainer sample in the batches")
    return table, rows, trained


def _context(context: Mapping[str, Any]) -> dict[str, Any]:
    from . import verifiers

    return context_values(context, {**verifiers.OWN_CONTEXT, **OWN_CONTEXT})


@guarded("prime_rl")
def to_contract(records: Iterable[Mapping[str, Any]], **context: Any) -> pa.Table:
    """The trainer's samples as contract trajectories: each joined to its verifiers trace branch, with
    the trainer's loss mask and, where it trains, its inference log-probs."""
    table, rows, trained = _join(records, _context(context))
    masks = [s["loss_mask"] for s in trained]
    # the trainer's log-probs where it trains; elsewhere prime-rl's 0.0 placeholder is no log-prob
    lps = [[lp if m else None for lp, m in zip(s["inference_logprobs"], s["loss_mask"])] for s in trained]
    meta = table.schema.metadata or {}
    out = table.take(pa.array(rows))
    out = out.set_column(out.schema.get_field_index("loss_mask"), "loss_mask", pa.array(masks, pa.list_(pa.bool_())))
    col = out.schema.get_field_index("behavior_logprobs")
    out = out.set_column(col, "behavior_logprobs", pa.array(lps, pa.list_(pa.float32())))
    origins = [str(getattr(s, "origin", "")) for s in trained]
    out = out.replace_schema_metadata({**meta, META_ORIGINS: json.dumps(origins).encode()})
    policy = json.loads(meta.get(META_TRAINER_SETTINGS) or b"{}")
    said = (policy.get("said") or "") + (
        f"; {len(rows)} trainer samples joined to their trace branches by token ids, "
        f"{table.num_rows - len(rows)} trace branches in no batch (not trained, not audited)"
    )
    return with_trainer_settings(out, said.lstrip("; "), **policy.get("settings", {}))


@guarded("prime_rl")
def updates(records: Iterable[Mapping[str, Any]], **context: Any) -> pa.Table | None:
    """One update record per step directory: the samples its ranks trained, each with its advantage
    (the one value on its trained tokens, as prime-rl broadcasts a scalar credit: `batch.py:355-366`).
    A step where some sample's advantages differ between trained tokens, or train none, records no
    advantages. The estimator only from `--context algo=grpo|echo`."""
    ctx = _context(context)
    table, rows, trained = _join(records, dict(ctx))
    tids = table.column("trajectory_id").to_pylist()
    steps: dict[int, dict[str, Any]] = {}
    for i, s in zip(rows, trained):
        u = steps.setdefault(s["step"] or 0, {"ids": [], "adv": [], "broadcast": True})
        values = {a for a, m in zip(s["advantages"], s["loss_mask"]) if m}
        u["ids"].append(tids[i])
        u["adv"].append(next(iter(values)) if len(values) == 1 else None)
        u["broadcast"] = u["broadcast"] and len(values) == 1
    algo = ctx.get("algo")
    if algo is not None and algo not in ALGOS:
        raise AdapterError(f"context 'algo': {algo!r} is not one of prime-rl's algorithms ({', '.join(ALGOS)})")
    estimator = {"advantage_estimator": "grpo_no_std"} if algo in GROUP_MEAN_ALGOS else {}
    updates: list[Mapping[str, Any]] = [
        {
            "update_step": k,
            "trajectory_ids": u["ids"],
            **({"advantages": u["adv"], **estimator} if u["broadcast"] else {}),
        }
        for k, u in sorted(steps.items())
    ]
    out = records_to_table(updates, kind="updates")
    lacks = dict(UPDATE_LACKS)
    if not estimator:
        why = "the estimator is prime-rl's [orchestrator.algo] type: pass --context algo=grpo (or echo) when it is one"
        lacks |= {"advantage_estimator": why, "updates.advantage_estimator": why}
    meta = {**(out.schema.metadata or {}), S.META_NOT_RECORDED: json.dumps(lacks, sort_keys=True).encode()}
    return out.replace_schema_metadata(meta)
