"""Arrow-level mutations of a compliant log, and a runner that audits each mutated log with
the real CLI in its own process (forked from a server that has the heavy libraries loaded,
so one case costs the audit, not the imports). Used by tests/test_fuzz.py, tests/test_hostile.py
(its child-process cases) and benchmarks/fuzz_campaign.py (the long campaign outside CI)."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from hypothesis import strategies as st

from rollout_audit.reading.records import records_to_table
from rollout_audit.synth import make_log

TRAJ_COLUMNS = [f.name for f in records_to_table(make_log(n_tasks=1, group_size=1, n_versions=1)[0]).schema]
UPDATE_COLUMNS = [
    "update_step",
    "trainer_version",
    "trajectory_ids",
    "reduction",
    "loss_denominator",
    "advantages",
    "advantage_estimator",
    "max_policy_lag",
]
HOSTILE = [
    "\x1b[2J\x1b]8;;https://evil.example\x07x",
    "a\n::error file=x,line=1::forged",
    "[link=https://e.x]y[/]",
    "x[/]y",
    "%0A,::",
    "\u202etxt",
    "\x00",
    "",
    "é" * 300,
]
TYPES = [
    pa.string(),
    pa.large_string(),
    pa.float64(),
    pa.float16(),
    pa.int8(),
    pa.uint64(),
    pa.bool_(),
    pa.null(),
    pa.list_(pa.string()),
    pa.list_(pa.float32()),
    pa.struct([("a", pa.int8())]),
    pa.binary(),
    pa.map_(pa.string(), pa.int64()),
    pa.dictionary(pa.int8(), pa.string()),
]


def ops(columns: list[str]) -> st.SearchStrategy:
    """One mutation of a table: (kind, column, parameter)."""
    col = st.sampled_from([*columns, "turns.action_text", "turns.policy_version", "turns.turn_id"])
    return st.one_of(
        st.tuples(
            st.sampled_from(["drop", "dup", "bad_utf8", "lists_shorter", "dictionary", "large"]), col, st.just(0)
        ),
        st.tuples(st.just("null"), col, st.integers(0, 3)),
        st.tuples(st.just("retype"), col, st.integers(0, len(TYPES) - 1)),
        st.tuples(st.just("rename"), col, st.sampled_from(columns + ["", "x" * 300, "a.b"])),
        st.tuples(st.just("extreme"), col, st.sampled_from([float("nan"), float("inf"), -1.0, 2.0**62, -(2.0**62)])),
        st.tuples(st.just("hostile"), col, st.integers(0, len(HOSTILE) - 1)),
        st.tuples(st.just("rows"), st.just(""), st.integers(0, 5)),
        st.tuples(st.just("strip_meta"), st.just(""), st.just(0)),
    )


# file-level damage after writing: none, truncate to a share of the bytes, or flip bytes at a seed
FILE_DAMAGE = st.one_of(
    st.just(("none", 0)),
    st.tuples(st.just("truncate"), st.integers(0, 99)),
    st.tuples(st.just("flip"), st.integers(0, 2**31)),
)


def _index(t: pa.Table, name: str) -> int:
    """Position of the first column called `name` (names may repeat after a `dup`)."""
    return t.schema.get_all_field_indices(name)[0]


def _replace(t: pa.Table, name: str, arr: pa.Array | pa.ChunkedArray) -> pa.Table:
    return t.set_column(_index(t, name), name, arr)


def _leaf(t: pa.Table, name: str) -> tuple[str, str | None]:
    """(top-level column, struct field inside `turns` or None)."""
    top, _, sub = name.partition(".")
    return top, (sub or None)


def _map_turn_field(t: pa.Table, field: str, fn) -> pa.Table:
    """Apply `fn` to one field of the `turns` structs (the rest untouched)."""
    turns = t.column(_index(t, "turns")).combine_chunks()
    values = turns.flatten()
    if not pa.types.is_struct(values.type) or values.type.get_field_index(field) < 0:
        return t
    i = values.type.get_field_index(field)
    children = [values.field(k) for k in range(values.type.num_fields)]
    children[i] = fn(children[i])
    names = [values.type.field(k).name for k in range(values.type.num_fields)]
    struct = pa.StructArray.from_arrays(children, names=names)
    return _replace(t, "turns", pa.ListArray.from_arrays(turns.offsets, struct))


def _bad_utf8(a: pa.Array) -> pa.Array:
    if len(a) == 0:
        return a
    vals = [(v if isinstance(v, str) else "x").encode() for v in a.to_pylist()]
    vals[len(vals) // 2] = b"ok\xff\xc3"
    return pa.array(vals, pa.binary()).view(pa.string())


def _retype(a: pa.Array, typ: pa.DataType) -> pa.Array:
    try:
        return a.cast(typ)
    except (pa.ArrowException, ValueError, TypeError):
        return pa.nulls(len(a), typ)


def _column_op(kind: str, a: pa.Array, param) -> pa.Array:
    """Mutate one column's values (as one array)."""
    if kind == "bad_utf8":
        return _bad_utf8(a) if pa.types.is_string(a.type) else a
    if kind == "null":
        mask = pa.array([(i + param) % 4 == 0 for i in range(len(a))])
        return pc.if_else(mask, pa.nulls(len(a), a.type), a) if not pa.types.is_nested(a.type) else a
    if kind == "retype":
        return _retype(a, TYPES[param])
    if kind == "extreme" and (pa.types.is_floating(a.type) or pa.types.is_integer(a.type)):
        return _retype(pa.array([param] * len(a), pa.float64()), a.type)
    if kind == "hostile" and pa.types.is_string(a.type):
        return pa.array([HOSTILE[param]] * len(a), pa.string())
    if kind == "lists_shorter" and pa.types.is_list(a.type):
        return pa.array([v[:-1] if v else v for v in a.to_pylist()], a.type)
    if kind == "dictionary" and pa.types.is_string(a.type):
        return a.dictionary_encode()
    if kind == "large":
        big = {pa.string(): pa.large_string()}.get(a.type)
        if pa.types.is_list(a.type):
            big = pa.large_list(a.type.value_type)
        return a.cast(big) if big is not None else a
    return a


def mutate(t: pa.Table, mutations: list[tuple]) -> pa.Table:
    """`t` with each mutation applied in order (a mutation that does not apply is a no-op)."""
    for kind, name, param in mutations:
        top, sub = _leaf(t, name)
        if kind == "rows":
            t = t.slice(0, param)
        elif kind == "strip_meta":
            t = t.replace_schema_metadata(None)
        elif top not in t.column_names:
            continue
        elif kind == "drop" and sub is None:
            t = t.remove_column(_index(t, top))
        elif kind == "dup" and sub is None:
            t = t.append_column(top, t.column(_index(t, top)))
        elif kind == "rename" and sub is None:
            t = t.rename_columns([param if c == top else c for c in t.column_names])
        elif sub is not None and top == "turns" and pa.types.is_list(t.schema.field(_index(t, "turns")).type):
            t = _map_turn_field(t, sub, lambda a, k=kind, p=param: _column_op(k, a, p))
        elif sub is None:
            t = _replace(t, top, _column_op(kind, t.column(_index(t, top)).combine_chunks(), param))
    return t


def damage(path: Path, how: tuple[str, int]) -> None:
    """File-level damage: truncate to a share of its bytes, or flip a few bytes."""
    kind, param = how
    data = bytearray(path.read_bytes())
    if kind == "truncate":
        data = data[: len(data) * param // 100]
    elif kind == "flip":
        for k in range(4):
            i = (param * (k + 7919)) % len(data)
            data[i] ^= 0xFF
    else:
        return
    path.write_bytes(bytes(data))


def build_log(root: Path, records, traj_mut: list, upd_mut: list, how: tuple[str, int]) -> Path:
    """A log under `root`: one mutated trajectory file (damaged as `how`), the clean rows again
    under other ids as one-trajectory files (which the engine checks together with the mutated
    file's rows when their schemas agree), updates."""
    trajs, ups = records
    t = records_to_table(trajs)
    (root / "trajectories").mkdir(parents=True)
    (root / "updates").mkdir()
    pq.write_table(mutate(t, traj_mut), root / "trajectories" / "a.parquet")
    damage(root / "trajectories" / "a.parquet", how)
    ids = pc.binary_join_element_wise(t["trajectory_id"], pa.scalar("-b"), "")
    b = t.set_column(t.schema.get_field_index("trajectory_id"), "trajectory_id", ids)
    for i in range(b.num_rows):
        pq.write_table(b.slice(i, 1), root / "trajectories" / f"b{i:03d}.parquet")
    pq.write_table(mutate(records_to_table(ups, "updates"), upd_mut), root / "updates" / "u.parquet")
    return root


def digest(root: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------- running the CLI per case

_CTX: mp.context.ForkServerContext | None = None


def _context() -> mp.context.ForkServerContext:
    """The fork server, started with the environment a user has (no ROLLOUT_AUDIT_DEBUG) and
    the libraries and the CLI already imported."""
    global _CTX
    if _CTX is None:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(
            [
                "polars",
                "pyarrow.parquet",
                "numpy",
                "pandera.polars",
                "rich.console",
                "rollout_audit.cli",
                "rollout_audit.running.engine",
                "rollout_audit.contract.registry",
                "rollout_audit.checks",
                "rollout_audit.reading.log",
                "rollout_audit.reporting.stats",
                "rollout_audit.reporting.html",
            ]
        )
        saved = os.environ.pop("ROLLOUT_AUDIT_DEBUG", None)
        try:
            p = ctx.Process(target=os.getpid)  # starts the server with this environment
            p.start()
            p.join()
        finally:
            if saved is not None:
                os.environ["ROLLOUT_AUDIT_DEBUG"] = saved
        _CTX = ctx
    return _CTX


def _to_files(out: str, err: str) -> None:
    """File descriptors 1 and 2 (native writes too) and sys.stdout/sys.stderr onto the files `out`, `err`."""
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(f, fd)
        os.close(f)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False)


def _child(args: list[str], out: str, err: str) -> None:
    """Run `rollout-audit ARGS` as a user would, stdout/stderr to files; exit with its code."""
    os.environ.pop("ROLLOUT_AUDIT_DEBUG", None)
    os.environ["ROLLOUT_AUDIT_NO_PROGRESS"] = "1"
    _to_files(out, err)
    code = 1
    try:
        from rollout_audit.cli import main

        main(args, prog_name="rollout-audit")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        import resource

        with open(out + ".rss", "w") as fh:  # peak resident memory, kB
            fh.write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))
    os._exit(code)


@dataclass
class Outcome:
    exit: int | None  # None: hung (killed after the timeout); negative: killed by a signal
    stdout: str
    stderr: str
    peak_mb: float = 0.0  # the process's peak resident memory

    @property
    def problems(self) -> list[str]:
        """What makes this case a failure (empty: it passed)."""
        out = []
        if self.exit is None:
            out.append("hang")
        elif self.exit not in (0, 1, 2):
            out.append(f"exit {self.exit}")
        if "Traceback" in self.stdout + self.stderr or "PanicException" in self.stderr:
            out.append("traceback")
        if "internal error" in self.stderr:
            out.append("internal error")
        if self.peak_mb > 2048:
            out.append("over 2 GB")
        if self.exit in (0, 1):
            try:
                json.loads(self.stdout)
            except ValueError:
                out.append("unparseable JSON")
        elif self.exit == 2 and not _one_line_per_reason(self.stderr):
            out.append("exit 2 without a one-line message")
        return out


def _one_line_per_reason(stderr: str) -> bool:
    """An exit 2's stderr: one line, or one `rollout-audit: error:` line per distinct reason (replay
    failing and a compare_logprobs column refused are two), never a usage block or a traceback; the
    trainer settings a conversion assumed (`rollout-audit: note:`) may come before them."""
    lines = [x for x in stderr.strip().splitlines() if not x.startswith("rollout-audit: note: ")]
    return len(lines) == 1 or (len(lines) > 1 and all(x.startswith("rollout-audit: error: ") for x in lines))


def run_cli(args: list[str], work: Path, timeout: float = 120) -> Outcome:
    """`rollout-audit ARGS` in a fresh process forked from the preloaded server."""
    out, err = work / "stdout.txt", work / "stderr.txt"
    p = _context().Process(target=_child, args=(args, str(out), str(err)))
    p.start()
    p.join(timeout)
    if p.is_alive():
        p.kill()
        p.join()
        return Outcome(None, "", "")
    rss = Path(str(out) + ".rss")
    peak = int(rss.read_text() or 0) / 1024 if rss.exists() else 0.0
    return Outcome(p.exitcode, out.read_text(errors="replace"), err.read_text(errors="replace"), peak)


# ---------------------------------------------------------------- the long campaign (outside CI)


def random_op(rng, columns: list[str]) -> tuple:
    """One mutation of `ops`' vocabulary on one of `columns` (or a turn field), drawn from `rng`."""
    col = rng.choice([*columns, "turns.action_text", "turns.policy_version", "turns.turn_id"])
    kind = rng.choice(
        [
            "drop",
            "dup",
            "bad_utf8",
            "lists_shorter",
            "dictionary",
            "large",
            "null",
            "retype",
            "rename",
            "extreme",
            "hostile",
            "rows",
            "strip_meta",
        ]
    )
    param = {
        "null": rng.randrange(4),
        "retype": rng.randrange(len(TYPES)),
        "rows": rng.randrange(6),
        "rename": rng.choice([*columns, "", "x" * 300, "a.b"]),
        "hostile": rng.randrange(len(HOSTILE)),
        "extreme": rng.choice([float("nan"), float("inf"), -1.0, 2.0**62, -(2.0**62)]),
    }.get(kind, 0)
    return kind, col, param


def random_case(seed: int) -> tuple[list, list, tuple[str, int], str]:
    """A case drawn from the same vocabulary as `ops` with a plain seeded RNG (fast to draw)."""
    import random

    rng = random.Random(seed)
    traj = [random_op(rng, TRAJ_COLUMNS) for _ in range(rng.randint(1, 3))]
    upd = [random_op(rng, UPDATE_COLUMNS) for _ in range(rng.randint(0, 1))]
    how = rng.choice([("none", 0), ("truncate", rng.randrange(100)), ("flip", rng.randrange(2**31))])
    fmt = rng.choice(["json", "json", "json", "github", "junit", "text"])
    return traj, upd, how, fmt


# ---------------------------------------------------------------- adapter dumps and configuration files

FRAMEWORKS = ("verl", "skyrl", "slime", "rllm", "verifiers", "openai")
DUMP_ROOT = Path(__file__).resolve().parent.parent / "fixtures" / "frameworks"
# what these trainers do not record, as a user passes it (`--context KEY=VALUE`)
DUMP_CONTEXT = ["environment_id=doors", "environment_version=v1", "verifier_version=v1", "reset_seed=0"]
_RAW = "\x00raw{}\x00"  # a placeholder json.dumps cannot produce, replaced by raw JSON text
# hostile leaf values: fractions and out-of-range numbers where integers are, strings where numbers
# or flags are, empty and wrongly typed containers, raw JSON text Python will not convert
LEAVES: list = [
    4975.7,
    1e30,
    float("inf"),
    float("-inf"),
    float("nan"),
    2**63,
    -(2**63) - 1,
    -1,
    0,
    "0",
    "1",
    "",
    "token_id:-5",
    "token_id:1e30",
    None,
    True,
    [],
    {},
    [None],
    "\x1b[2J\n::error::x",
    ("raw", "1" * 5000),
    ("raw", "[" * 20000 + "]" * 20000),
    ("raw", "1e999"),
    ("raw", "-0"),
]
LINE_DAMAGE = ("none", "not_utf8", "truncate", "nested", "blank", "array", "huge_int")


def _paths(x, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value inside a JSON document (containers included)."""
    out = [prefix] if prefix else []
    if isinstance(x, dict):
        for k, v in x.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(x, list):
        for i, v in enumerate(x[:4]):
            out += _paths(v, (*prefix, i))
    return out


def _set(doc, path: tuple, value, op: str) -> None:
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    key = path[-1]
    if op == "delete":
        del parent[key]
    elif op == "duplicate" and isinstance(parent, list):
        parent.insert(key, parent[key])
    else:
        parent[key] = value


# cases the long campaign found failing, fixed since (tests/test_fuzz.py replays them): dumps 341 (a
# policy version of 1e30), 887 (a prompt token id below int64), 153 (a list where a weight version is), 262 (a number
# where a node's message is), 353 (text where a choice's message is), 773 (an object among log-probs),
# 1450 (an object as a node's parent), 1669 (a step past int64, Parquet), 2091 (a number as the steps),
# 4264 (a number as a response's choices), 416 (an infinite weight version), 3745 (a list as a stop reason);
# configurations 404 (a 400-digit atol), 48 (/dev/zero as the baseline), 83 (a family in tolerated_share),
# 162 (a directory as the baseline)
REGRESSION_SEEDS = {
    "dumps": [341, 887, 153, 262, 353, 773, 1450, 1669, 2091, 4264, 416, 3745],
    "configs": [404, 48, 83, 162],
    # the contract 1.3 evidence (`--kind evidence`): 871 and 1422 (an rLLM routing header nested too
    # deeply: internal error), 168 and 581 (a list or a string where verl's extra_fields are: no field named)
    "evidence": [871, 1422, 168, 581],
    # `--kind round5`: 5741 and 9965 (a verl template id outside int32), 8656 (a verifiers trace's calls
    # an integer): "a field has the wrong shape", naming no field
    "round5": [5741, 9965, 8656],
}


def _dump_base(seed: int) -> tuple[str, Path, str]:
    """The framework, the fixture a dump case mutates, and how it is stored ("jsonl" or "parquet").
    Drawn from a stream of its own, so a case on the compliant JSON Lines fixture is the same bytes
    as when it was the only base."""
    import random

    fw = FRAMEWORKS[seed % len(FRAMEWORKS)]
    rng = random.Random(f"dump-origin:{seed}")
    others = sorted(p for p in (DUMP_ROOT / fw).glob("*.jsonl") if p.name != "compliant.jsonl")
    base = DUMP_ROOT / fw / "compliant.jsonl"
    if others and rng.random() < 0.5:
        base = rng.choice(others)
    return fw, base, "parquet" if rng.random() < 0.15 else "jsonl"


def dump_case(seed: int) -> tuple[str, bytes]:
    """A framework and the bytes of a mutated JSON Lines dump of one of its fixtures."""
    import random

    rng = random.Random(seed)
    fw, base, _ = _dump_base(seed)
    return fw, mutated_lines(rng, [json.loads(x) for x in base.read_text().splitlines() if x.strip()])


def mutated_lines(rng, lines: list) -> bytes:
    """JSON Lines of the records `lines` with one to three values set, deleted or duplicated at random
    paths (LEAVES: hostile values, raw JSON text), then the file damaged (LINE_DAMAGE) or not."""
    raws: list[str] = []
    for _ in range(rng.randint(1, 3)):
        rec = rng.choice(lines)
        paths = _paths(rec)
        if not paths:
            continue
        path = rng.choice(paths)
        op = rng.choice(["set", "set", "set", "delete", "duplicate"])
        leaf = rng.choice(LEAVES)
        if isinstance(leaf, tuple):
            raws.append(leaf[1])
            leaf = _RAW.format(len(raws) - 1)
        _set(rec, path, leaf, op)
    text = "\n".join(json.dumps(x) for x in lines) + "\n"
    for i, raw in enumerate(raws):
        text = text.replace(json.dumps(_RAW.format(i)), raw)
    data = text.encode()
    kind = rng.choice(LINE_DAMAGE + ("none",) * 4)
    if kind == "not_utf8":
        data = data.replace(b"\n", b"\n\xff\xfe", 1)
    elif kind == "truncate":
        data = data[: rng.randrange(len(data))]
    elif kind == "nested":
        data += b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
    elif kind == "blank":
        data = b"\n \n" + data
    elif kind == "array":
        data += b"[1, 2]\n"
    elif kind == "huge_int":
        data += b'{"x": ' + b"9" * 5000 + b"}\n"
    return data


CONFIG_KEYS = [
    "select",
    "ignore",
    "atol",
    "rtol",
    "truncation",
    "extra_stop_reasons",
    "loop_length",
    "max_response_tokens",
    "difficulty_band",
    "max_examples",
    "max_row_group_bytes",
    "max_tokens_per_trajectory",
    "replay",
    "replayer",
    "replay_checkpoints",
    "replay_endpoints",
    "replay_batch_size",
    "compare_logprobs",
    "unknown_key",
]
CONFIG_VALUES = [
    "1",
    "-1",
    "0",
    "1e308",
    "inf",
    "nan",
    "true",
    '""',
    '"x"',
    '["Z999"]',
    '[""]',
    '["M", "R4"]',
    '"R409"',
    "[0.1, 0.9]",
    "[1, 2, 3]",
    '{"0" = "http://127.0.0.1:9/v1"}',
    '"{version:>999999999}"',
    '"ckpt/{version}"',
    '"sys:exit"',
    '"os:system"',
    "{a = {b = {c = 1}}}",
    "9" * 400,
    '"\\u0000"',
    "[" * 3000 + "]" * 3000,
    "2024-01-01",
]


def config_case(seed: int) -> tuple[str, bytes]:
    """Where a configuration goes ("explicit": --config FILE; "log": a pyproject.toml found with the
    audited log, in the directory that holds it, where every key but the trusted ones is read) and
    its bytes: a few settings with hostile values, or a broken document."""
    import random

    rng = random.Random(seed)
    where = rng.choice(["explicit", "log"])
    body = "".join(f"{rng.choice(CONFIG_KEYS)} = {rng.choice(CONFIG_VALUES)}\n" for _ in range(rng.randint(1, 3)))
    typed = _typed_settings(seed)
    if typed:  # settings of the right type at their extremes: the audit runs under them
        return where, ("[tool.rollout-audit]\n" + typed).encode()
    head = rng.choice(["[tool.rollout-audit]\n", "[tool.rollout-audit]\n", "[tool]\nrollout-audit = 5\n", ""])
    if where == "log" and not head:
        head = "[tool.rollout-audit]\n"
    data = (head + body).encode()
    kind = rng.choice(["none", "none", "none", "truncate", "not_utf8", "duplicate", "nested"])
    if kind == "truncate":
        data = data[: rng.randrange(len(data))]
    elif kind == "not_utf8":
        data += b"# \xff\xfe\n"
    elif kind == "duplicate":
        data += data
    elif kind == "nested":
        data += b"deep = " + b"{a = " * 5000 + b"1" + b"}" * 5000 + b"\n"
    return where, data + _config_extra(seed, head)


EXTRA_CONFIG_KEYS = [
    "logprob_atol",
    "truncation_penalty",
    "first_visit_components",
    "max_policy_lag",
    "reward_rule",
    "grpo_epsilon",
    "masked_ok_reasons",
    "storage_connect_timeout",
    "storage_request_timeout",
    "replay_connect_timeout",
    "replay_timeout",
    "replay_max_response_bytes",
    "replay_atol",
    "replay_max_share",
    "max_turn_log_ratio",
    "baseline",
    "tolerated_share",
]
EXTRA_CONFIG_VALUES = [
    '{"M101" = 0.5}',
    '{"Z999" = 2}',
    '{"" = 0.1}',
    '{"M" = 1.5}',
    '"/dev/zero"',
    '"missing.json"',
    '"."',
    "-0.0",
    "1e-320",
    "[[1]]",
    "'''multi\nline'''",
    '"binary"',
    '"penalize"',
]


# values of each setting's own type, at the edges of what it accepts (and a little past them)
TYPED_VALUES = {
    "select": ['["M"]', '["M101", "L2"]', '["S"]', "[]"],
    "ignore": ['["M"]', '["S001"]', "[]"],
    "atol": ["0", "1e308", "5e-324"],
    "rtol": ["0", "1e308"],
    "logprob_atol": ["0", "1e300"],
    "truncation": ['"exclude"', '"bootstrap"', '"penalize"'],
    "truncation_penalty": ["-1e308", "0", "1e308"],
    "extra_stop_reasons": ['{"x" = "truncated"}', '{"" = "terminated"}', '{"stop" = "infra_error"}'],
    "first_visit_components": ['["x"]', "[]"],
    "loop_length": ["2", "1000000000"],
    "max_response_tokens": ["1", "0", "9223372036854775807"],
    "max_policy_lag": ["0", "9223372036854775807"],
    "reward_rule": ['"binary"', '"monotone"'],
    "grpo_epsilon": ["0", "1e308"],
    "difficulty_band": ["[0.0, 0.0]", "[1.0, 0.0]", "[0.0, 1.0]"],
    "max_examples": ["0", "1000000"],
    "masked_ok_reasons": ['["stop"]', '[""]'],
    "max_row_group_bytes": ["1", "9223372036854775807"],
    "max_tokens_per_trajectory": ["1", "9223372036854775807"],
    "replay_max_share": ["0", "1"],
    "max_turn_log_ratio": ["1e-300", "1e308"],
    "tolerated_share": ['{"M101" = 1.0}', '{"S" = 0.0}', '{"E801" = 1e-300}'],
    "storage_connect_timeout": ["1e-9", "1e308"],
    "baseline": ['"missing.json"', '"/dev/zero"', '"."'],
    "compare_logprobs": ['"behavior_logprobs"', '"nope"'],
}


def _typed_settings(seed: int) -> str:
    """For 4 cases in 10 (a stream of their own), 1 to 4 settings with values of their own type."""
    import random

    rng = random.Random(f"config-typed:{seed}")
    if rng.random() >= 0.4:
        return ""
    keys = rng.sample(sorted(TYPED_VALUES), rng.randint(1, 4))
    return "".join(f"{k} = {rng.choice(TYPED_VALUES[k])}\n" for k in keys)


def _config_extra(seed: int, head: str) -> bytes:
    """Settings added to half the configuration cases, from a stream of their own (so the rest of a
    case is the same bytes as before these keys were fuzzed): the keys above, with values from both lists."""
    import random

    rng = random.Random(f"config-extra:{seed}")
    if rng.random() < 0.5:
        return b""
    lines = [
        f"{rng.choice(EXTRA_CONFIG_KEYS)} = {rng.choice(CONFIG_VALUES + EXTRA_CONFIG_VALUES)}\n"
        for _ in range(rng.randint(1, 2))
    ]
    return ((head if head.startswith("[tool.rollout-audit]") else "") + "".join(lines)).encode()


@dataclass
class Case:
    """One campaign case, written to disk: the CLI arguments, and the inputs (files or log
    directories) that the audit must leave unchanged and that a refusal (exit 2) must name."""

    kind: str  # "logs", "dumps" or "configs"
    seed: int
    args: list[str]
    inputs: list[Path]
    label: str  # the adapter (dumps), where the configuration is (configs), the output format (logs)
    fmt: str = "json"


def _dump_file(seed: int, work: Path) -> tuple[str, Path]:
    """The mutated dump of `seed` written under `work`: JSON Lines, or (for some cases) the records
    that still parse as one Parquet file; the framework and the path."""
    fw, data = dump_case(seed)
    _, _, store = _dump_base(seed)
    if store == "parquet":
        records = []
        for line in data.splitlines():
            try:
                rec = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(rec, dict):
                records.append(rec)
        dump = work / "dump.parquet"
        try:
            pq.write_table(pa.Table.from_pylist(records), dump)
            return fw, dump
        except (pa.ArrowException, ValueError, TypeError, OverflowError):
            dump.unlink(missing_ok=True)  # records Parquet cannot hold in one schema stay JSON Lines
    dump = work / "dump.jsonl"
    dump.write_bytes(data)
    return fw, dump


def prepare_dump(seed: int, work: Path) -> Case:
    """`check --from FRAMEWORK DUMP` on the mutated dump of `seed`."""
    fw, dump = _dump_file(seed, work)
    ctx = [x for kv in DUMP_CONTEXT for x in ("--context", kv)]
    return Case("dumps", seed, ["check", "--from", fw, str(dump), *ctx, "--format", "json"], [dump], fw)


def prepare_config(seed: int, work: Path, log: Path) -> Case:
    """`check LOG` on a copy of `log` under the mutated configuration of `seed` (a pyproject.toml
    beside the log, or `--config FILE`). Beside, not inside: inside the log a configuration may set
    only the run's context, and the fuzzed settings would mostly stop at that refusal."""
    import shutil

    where, data = config_case(seed)
    target = work / "run" / "log"
    shutil.copytree(log, target)
    cfg = target.parent / "pyproject.toml" if where == "log" else work / "c.toml"
    cfg.write_bytes(data)
    args = ["check", str(target), "--format", "json"] + (["--config", str(cfg)] if where == "explicit" else [])
    return Case("configs", seed, args, [target, cfg], where)


def prepare_log(seed: int, work: Path, records) -> Case:
    """`check LOG` on a log with the Arrow-level mutations of `seed` (`random_case`)."""
    traj, upd, how, fmt = random_case(seed)
    log = build_log(work / "log", records, traj, upd, how)
    return Case("logs", seed, ["check", str(log), "--format", fmt], [log], fmt, fmt)


def digests(paths: list[Path]) -> dict[str, str]:
    """The SHA-256 of every file of `paths` (a file, or a directory's files)."""
    out: dict[str, str] = {}
    for p in paths:
        out.update(digest(p) if p.is_dir() else {str(p): hashlib.sha256(p.read_bytes()).hexdigest()})
    return out


# what a refusal says when the code did not foresee the shape: it names the record but not the field
UNNAMED = ("a field has the wrong shape", "malformed record", "do not fit the contract's types")


def judge(case: Case, out: Outcome, before: dict[str, str]) -> list[str]:
    """What makes the case a failure: the outcome's problems, an input written, or a refusal that
    names none of the inputs (a dump refused must name the file and its line)."""
    problems = [p for p in out.problems if case.fmt == "json" or p != "unparseable JSON"]
    if digests(case.inputs) != before:
        problems.append("input written")
    if out.exit == 2 and out.stderr.strip():
        message = out.stderr.strip().splitlines()[-1]
        named = [n for p in case.inputs for n in (str(p), os.path.relpath(p))]  # as given, or from the directory
        if not any(n in message for n in named):
            problems.append("exit 2 names no input")
        if any(g in message for g in UNNAMED):
            problems.append("exit 2 names no field")
    return problems


def run_case(case: Case, work: Path, timeout: float = 60) -> tuple[Outcome, list[str]]:
    """`case` in a fresh process forked from the preloaded server (the mode that confirms a finding)."""
    before = digests(case.inputs)
    out = run_cli(case.args, work, timeout)
    return out, judge(case, out, before)


def run_dump_case(seed: int, work: Path, timeout: float = 60) -> tuple[Outcome, list[str]]:
    """Audit the mutated dump of `seed` with `check --from` in its own process; the outcome and its problems."""
    return run_case(prepare_dump(seed, work), work, timeout)


def run_config_case(seed: int, work: Path, log: Path, timeout: float = 60) -> tuple[Outcome, list[str]]:
    """Audit a copy of `log` under the mutated configuration of `seed` in its own process."""
    return run_case(prepare_config(seed, work, log), work, timeout)


def peak_reset() -> None:
    """Reset this process's peak resident memory (Linux), so that `peak_mb` is one case's."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def peak_mb() -> float:
    """This process's peak resident memory since the last `peak_reset`, MB."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def run_in_process(args: list[str], work: Path) -> Outcome:
    """`rollout-audit ARGS` in this process, through the entry point a user's command runs (click's
    `main` in standalone mode): file descriptors 1 and 2 go to files for the call (native writes
    included), the exit code is the SystemExit's; an exception that escapes is a traceback."""
    import traceback

    from rollout_audit.cli import main

    out_path, err_path = work / "stdout.txt", work / "stderr.txt"
    saved = [os.dup(1), os.dup(2)]
    streams = (sys.stdout, sys.stderr)
    _to_files(str(out_path), str(err_path))
    cwd, env = os.getcwd(), dict(os.environ)
    code: int | None = 0
    try:
        main(args, prog_name="rollout-audit", standalone_mode=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - what escaped the CLI is the failure being looked for
        code = 1
        with open(2, "w", closefd=False) as fh:
            fh.write(traceback.format_exc())
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        sys.stdout, sys.stderr = streams
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)
        os.chdir(cwd)  # what one case changed in the process does not reach the next
        os.environ.clear()
        os.environ.update(env)
    return Outcome(code, out_path.read_text(errors="replace"), err_path.read_text(errors="replace"))


# ---------------------------------------------------------------- the workflow commands (baselines, diff,
# filter, watch with a writer process, convert, configurations at every depth of a log)

WORKFLOW = ("baseline", "diff", "filter", "watch", "convert", "config_depth")


@dataclass
class FollowUp:
    """A command run after a case's command when that one exited with one of `when`: it must exit
    with one of `expect` (else `problem`), and is judged like any case (no traceback, ...)."""

    args: list[str]
    when: tuple[int, ...]
    expect: tuple[int, ...]
    problem: str


@dataclass
class WorkflowCase(Case):
    follow: list[FollowUp] | None = None
    writer: list[str] | None = None  # a writer process's command, run while the case's command runs
    clean: list[Path] | None = None  # directories in which the command must leave no hidden temp files
    named: list[Path] | None = None  # what else a refusal (exit 2) may name (the watched directory)
    found: list[str] | None = None  # what went wrong while the case was made (the recorder's own failures)


def _baseline_doc(rng, records, hostile: str) -> bytes:
    """A baseline for the log of `records`, mutated: its findings as the wrong shapes, hostile
    strings, huge or negative counts, or not JSON at all."""
    import polars as pl

    from rollout_audit import __version__
    from rollout_audit.session.verdict import BASELINE_FORMAT, content_digests

    ids = sorted(t["trajectory_id"] for t in records[0])[:16]
    rows = pl.DataFrame(
        [(t["trajectory_id"], t["token_ids"]) for t in records[0]],
        schema={"trajectory_id": pl.String, "token_ids": pl.List(pl.Int64)},
        orient="row",
    )
    got = content_digests(rows)  # the fingerprint of the unmutated log (a mutation of token ids changes it)
    entry = {"code": "M101", "trajectory_id": ids[0], "turn": 1, "position": 3, "where": None, "digest": "0" * 12}
    findings: object = [dict(entry, count=rng.choice([1, 0, -5, 2**70, 1.5, "3", None]))]
    shape = rng.choice(
        ["ok", "object", "strings", "nested", "hostile", "huge", "nulls", "wrong_ids", "version", "digests"]
    )
    doc: dict = {
        "rollout_audit_baseline": BASELINE_FORMAT,
        "tool_version": __version__,
        "log": {
            "sample_trajectory_ids": ids,
            "sample_token_digests": [got[i] for i in ids],
            "trajectories": len(records[0]),
        },
        "findings": findings,
    }
    if shape == "object":
        doc["findings"] = {"code": "M101"}
    elif shape == "strings":
        doc["findings"] = ["M101", 3, None, [1, 2]]
    elif shape == "nested":
        doc["findings"] = [dict(entry, code={"a": [1]}, turn="x", position=[1])]
    elif shape == "hostile":
        doc["findings"] = [dict(entry, code=hostile, trajectory_id=hostile, where=hostile, count=1)]
    elif shape == "huge":
        doc["findings"] = [dict(entry, count=1)] * 5000
    elif shape == "nulls":
        doc = {k: None for k in doc} | {"rollout_audit_baseline": BASELINE_FORMAT, "tool_version": __version__}
    elif shape == "wrong_ids":
        doc["log"] = {"sample_trajectory_ids": [hostile, 5, None], "trajectories": "many"}
    elif shape == "version":
        doc["tool_version"] = hostile
    elif shape == "digests":  # the fingerprint missing, of another length, of other types or other values
        doc["log"]["sample_token_digests"] = rng.choice([None, [], [hostile], [5] * len(ids), ["0" * 16] * len(ids)])
    data = json.dumps(doc).encode()
    cut = rng.choice(["none", "none", "none", "truncate", "not_utf8", "deep"])
    if cut == "truncate":
        data = data[: rng.randrange(len(data))]
    elif cut == "not_utf8":
        data = data.replace(b"M101", b"M\xff101", 1)
    elif cut == "deep":
        data = b"[" * 100_000 + b"]" * 100_000
    return data


def _bomb(root: Path, records, rng, n: int = 9_000_000) -> None:
    """A trajectory file beside the others with one row group holding a trajectory of `n` tokens
    (over max_tokens_per_trajectory at 9M): a few hundred KB on disk."""
    import numpy as np

    t = records_to_table([dict(records[0][0], trajectory_id="bomb")])
    cols = []
    for name in t.column_names:
        col = t.column(name).combine_chunks()
        if name in ("token_ids", "token_source", "loss_mask", "behavior_logprobs", "token_turn"):
            vt = col.type.value_type
            zeros = np.zeros(n, dtype=bool if pa.types.is_boolean(vt) else vt.to_pandas_dtype())
            col = pa.ListArray.from_arrays(pa.array([0, n], pa.int32()), pa.array(zeros).cast(vt))
        cols.append(col)
    pq.write_table(pa.Table.from_arrays(cols, schema=t.schema), root / "trajectories" / "z-bomb.parquet")


WATCH_WRITER = r"""
import os, shutil, sys, time, random
src, out, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = random.Random(seed)
files = sorted(os.path.join(src, f) for f in os.listdir(src))
for i in range(rng.randint(1, 3)):
    time.sleep(rng.uniform(0.0, 0.3))
    f = rng.choice(files)
    dst = os.path.join(out, f"step-{i:04d}.parquet")
    how = rng.choice(["rename", "rename", "in_place", "replace_later", "append_later", "empty", "link_out", "cut"])
    data = open(f, "rb").read()
    if how == "link_out":
        os.symlink(os.path.abspath(f), dst)
        continue
    if how == "empty":
        open(dst, "wb").close()
        continue
    if how == "cut":
        data = data[: rng.randrange(max(1, len(data)))]
    if how == "in_place":
        with open(dst, "wb") as fh:
            for k in range(0, len(data), 4096):
                fh.write(data[k : k + 4096])
                fh.flush()
        continue
    tmp = os.path.join(out, f".step-{i}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, dst)
    if how in ("replace_later", "append_later"):
        time.sleep(0.6)
        if how == "append_later":
            with open(dst, "ab") as fh:
                fh.write(b"garbage")
        else:
            other = open(rng.choice(files), "rb").read()
            with open(tmp, "wb") as fh:
                fh.write(other[: len(other) // 2])
            os.replace(tmp, dst)
"""


def prepare_workflow(seed: int, work: Path, records) -> WorkflowCase:
    """The case of `seed` on one of the workflow commands (WORKFLOW, in turn), on logs with the
    Arrow-level mutations of `random_case`."""
    import random
    import shutil

    rng = random.Random(seed)
    what = WORKFLOW[seed % len(WORKFLOW)]
    traj, upd, how, fmt = random_case(seed)
    fmt = "json" if fmt in ("github", "junit") else fmt
    hostile = rng.choice(HOSTILE)
    if what == "baseline":
        log = build_log(work / "log", records, traj, upd, how)
        base = work / "b.json"
        base.write_bytes(_baseline_doc(rng, records, hostile))
        if rng.random() < 0.3:  # the baseline written for a log accepts that log, findings and fingerprint
            args = ["check", str(log), "--write-baseline", str(work / "new.json")]
            again = ["check", str(log), "--baseline", str(work / "new.json"), "--format", "json"]
            follow = [
                FollowUp(again, (0,), (0,), "silent refusal: a baseline does not accept the log it was written for")
            ]
            return WorkflowCase("workflow", seed, args, [log, base], what, "text", follow)
        # the generated baseline records no finding this log has (its digest is of no message): a
        # pass with it is a pass without it
        plain = ["check", str(log), "--format", "json"]
        follow = [FollowUp(plain, (0,), (0,), "silent pass: the baseline hid a finding it did not record")]
        return WorkflowCase(
            "workflow",
            seed,
            ["check", str(log), "--baseline", str(base), "--format", fmt],
            [log, base],
            what,
            fmt,
            follow,
        )
    if what == "diff":
        a = build_log(
            work / "a", records, traj if rng.random() < 0.5 else [], upd, how if rng.random() < 0.3 else ("none", 0)
        )
        t2, u2, h2, _ = random_case(seed + 10**6)
        b = build_log(work / "b", records, t2, u2, h2)
        pick = rng.choice(["", "trajectories", "trajectories/a.parquet"])
        args = ["diff", str(a / pick if pick else a), str(b / pick if pick else b), "--format", fmt]
        return WorkflowCase("workflow", seed, [*args, *(["--all"] if fmt == "text" else [])], [a, b], what, fmt)
    if what == "filter":
        log = build_log(work / "log", records, traj, upd, how)
        if rng.random() < 0.05:
            _bomb(log, records, rng)
        out = work / "filtered"
        follow = [
            FollowUp(["check", str(out), "--format", "json"], (0,), (0,), "silent pass: filter 0, check OUT not 0")
        ]
        return WorkflowCase("workflow", seed, ["filter", str(log), str(out)], [log], what, "text", follow, None, [work])
    if what == "watch":
        src = work / "src"
        log = build_log(work / "log", records, traj, upd, how)
        src.mkdir()
        for i, f in enumerate(sorted((log / "trajectories").glob("*.parquet"))[:4]):
            shutil.copy(f, src / f"{i}.parquet")
        d = work / "run"
        d.mkdir()
        (work / "writer.py").write_text(WATCH_WRITER)
        args = ["watch", str(d), "--interval", "0.05", "--idle", "1.0", "--status", str(work / "s.json"),
                "--metrics", str(work / "m.jsonl")]  # fmt: skip
        writer = [sys.executable, str(work / "writer.py"), str(src), str(d), str(seed)]
        return WorkflowCase("workflow", seed, args, [src, log], what, "text", None, writer, None, [d])
    if what == "convert":
        fw, dump = _dump_file(seed, work)
        out = work / "converted"
        ctx = [x for kv in DUMP_CONTEXT for x in ("--context", kv)]
        follow = [FollowUp(["check", str(out), "--format", "json"], (0, 1), (0, 1, 2), "check of the converted log")]
        return WorkflowCase(
            "workflow",
            seed,
            ["convert", "--from", fw, str(dump), str(out), *ctx],
            [dump],
            what,
            "text",
            follow,
            None,
            [work],
        )
    # a configuration at a depth of the log, the log named at a depth: a configuration inside the log
    # may state only how the run was produced; any other key is refused (exit 2), never obeyed
    log = work / "run" / "log"
    shutil.copytree(BROKEN_LOG, log)
    depth = rng.choice(["root", "trajectories", "sub", "beside", "explicit"])
    if depth == "sub":
        (log / "trajectories" / "part").mkdir()
        for f in list((log / "trajectories").glob("*.parquet")):
            shutil.move(str(f), log / "trajectories" / "part" / f.name)
    place = {"root": log, "trajectories": log / "trajectories", "sub": log / "trajectories" / "part",
             "beside": log.parent, "explicit": work}[depth]  # fmt: skip
    cfg = place / ("c.toml" if depth == "explicit" else "pyproject.toml")
    key = rng.choice(['ignore = ["M"]', 'select = ["S"]', "atol = 1e9", 'tolerated_share = {M101 = 1.0}',
                      'baseline = "b.json"', 'replayer = "os:getcwd"', "max_response_tokens = 48"])  # fmt: skip
    _, noise = config_case(seed)
    cfg.write_bytes(b"[tool.rollout-audit]\n" + key.encode() + b"\n" + (noise if rng.random() < 0.3 else b""))
    named = rng.choice(["log", "trajectories", "file", "merge"])
    files = sorted((log / "trajectories").rglob("*.parquet"))
    paths = {"log": [str(log)], "trajectories": [str(log / "trajectories")], "file": [str(files[0])],
             "merge": ["--merge", str(log / "trajectories"), str(log / "updates")]}[named]  # fmt: skip
    args = ["check", *paths, "--format", "json"] + (["--config", str(cfg)] if depth == "explicit" else [])
    inside = depth in ("root", "trajectories", "sub")
    case = WorkflowCase("workflow", seed, args, [log, cfg], f"{what}:{depth}:{named}", "json")
    if inside and not key.startswith("max_response"):  # the log's own file may not weaken its audit
        case.follow = [FollowUp(args, (0,), (1, 2), "silent pass: a configuration inside the log was obeyed")]
    return case


BROKEN_LOG = Path(__file__).resolve().parent.parent / "fixtures" / "broken" / "tool_tokens_trained"


def follow_ups(case: Case, out: Outcome, run) -> list[str]:
    """The problems of a case's follow-up commands (`run(args) -> Outcome`), and hidden temporary
    files a command left in the directories it must leave clean."""
    problems: list[str] = []
    for f in getattr(case, "follow", None) or []:
        if out.exit not in f.when:
            continue
        if f.args == case.args:  # the same command: its outcome is the case's own
            if out.exit not in f.expect:
                problems.append(f.problem)
            continue
        o = run(f.args)
        problems += [f"follow-up: {p}" for p in o.problems]
        if o.exit not in f.expect:
            problems.append(f.problem)
    for d in getattr(case, "clean", None) or []:
        if any(p.name.startswith(".") and ".filter-" in p.name for p in d.iterdir()):
            problems.append("hidden temporary output left")
    return problems


def run_workflow_case(case: Case, work: Path, run, timeout: float = 60) -> tuple[Outcome, list[str]]:
    """Run `case` with `run(args) -> Outcome`, its writer process alongside (killed if still
    running when the command ends), then judge it and its follow-ups."""
    import subprocess

    before = digests(case.inputs)
    writer = None
    if getattr(case, "writer", None):
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
        writer = subprocess.Popen(case.writer, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # type: ignore[arg-type]
    try:
        out = run(case.args)
    finally:
        if writer is not None:
            try:
                writer.wait(timeout=30)
            except subprocess.TimeoutExpired:
                writer.kill()
                writer.wait()
    problems = judge(case, out, before)
    extra = [n for p in getattr(case, "named", None) or [] for n in (str(p), os.path.relpath(p))]
    if "exit 2 names no input" in problems and any(n in out.stderr for n in extra):
        problems.remove("exit 2 names no input")
    problems += follow_ups(case, out, run)
    problems += getattr(case, "found", None) or []
    return out, problems


# ---------------------------------------------------------------- contract 1.3 evidence in trainer dumps

# The framework fixtures that carry the 1.3 evidence (expert routes, loss streams and weights, overlong
# penalties), compliant and faulty, with the context their page documents (DAPO settings, the trainer)
_VERL = ["response_length=64", "top_k=-1", "temperature=1.0", "top_p=1.0"]
_VERL_DAPO = [*_VERL, "max_resp_len=64", "overlong_buffer_len=16", "overlong_penalty_factor=1.0"]
_SKYRL = ["temperature=1.0", "top_p=1.0"]
_SKYRL_DAPO = [*_SKYRL, "max_generate_length=64", "overlong_buffer_len=32", "overlong_buffer_penalty_factor=1.0"]
_PRIME = ["trainer=prime-rl"]
EVIDENCE = (
    ("verl", "compliant_routes_vllm", _VERL),
    ("verl", "fully_async_routes", _VERL),
    ("verl", "routes_resumed_duplicated", _VERL),
    ("verl", "routes_resumed_replaced", _VERL),
    ("verl", "compliant_dapo", _VERL_DAPO),
    ("verl", "dapo_overlong_counts_tool_tokens", _VERL_DAPO),
    ("rllm", "compliant_routes", ["temperature=0.7", "top_p=1.0"]),
    ("rllm", "routes_across_weight_sync", ["temperature=0.7", "top_p=1.0"]),
    ("slime", "compliant_moe", _SKYRL),
    ("slime", "partial_rollout_moe", _SKYRL),
    ("slime", "routes_of_resumed_weights", _SKYRL),
    ("slime", "routes_resumed_duplicated", _SKYRL),
    ("skyrl", "compliant_moe", _SKYRL),
    ("skyrl", "routes_appended_each_turn", _SKYRL),
    ("skyrl", "routes_lost_after_first_turn", _SKYRL),
    ("skyrl", "compliant_dapo", _SKYRL_DAPO),
    ("skyrl", "dapo_penalty_counts_observations", _SKYRL_DAPO),
    ("verifiers", "compliant_prime_rl", _PRIME),
    ("verifiers", "compliant_prime_rl_echo", [*_PRIME, "policy_version=3"]),
    ("verifiers", "compliant_prime_rl_moe", _PRIME),
    ("verifiers", "prime_rl_echo_on_next_action", [*_PRIME, "policy_version=3"]),
    ("verifiers", "prime_rl_echo_on_scaffold", [*_PRIME, "policy_version=3"]),
    ("verifiers", "prime_rl_routes_duplicated", _PRIME),
    ("verifiers", "prime_rl_routes_lost", _PRIME),
)
# the record keys of that evidence: a mutation lands under one of them most of the time
EVIDENCE_KEYS = frozenset(
    {
        "routed_experts",
        "routed_experts_rows",
        "routed_experts_sha256",
        "routed_experts_versions",
        "routed_experts_start_len",
        "routed_experts_len",
        "rollout_routed_experts",
        "rollout_expert_indices",
        "rollout_expert_indices_start",
        "rollout_expert_indices_rows",
        "rollout_expert_indices_len",
        "routing_matrices",
        "attempts",
        "weight_version",
        "weight_versions",
        "global_steps",
        "min_global_steps",
        "max_global_steps",
        "loss_weights",
        "mask",
        "is_content",
        "overlong_reward",
        "overlong_penalty",
        "reward_extra_info",
        "extra_fields",
        "run",
        "work",
        "policy",
        "start",
        "end",
        "group",
        "shape",
        "dtype",
        "data",
    }
)
_BIG = 10**12
# values that claim huge sizes in a few bytes, headers and payloads of the wrong form, counts of the wrong
# sign or type, NaN and infinite weights and penalties, strings with terminal and CI escapes
EVIDENCE_LEAVES: list = [
    _BIG,
    2**31,
    2**63 - 1,
    -(2**31) - 1,
    -3,
    0.5,
    float("nan"),
    float("-inf"),
    "////",
    "AAAA" * 64,
    "!!!",
    "\x1b[2J\n::error::forged<script>",
    "a" * 64,
    [[_BIG, 7]],
    [[-1, 7]],
    [[3, 10**30]],
    [[0, 7]] * 3,
    [[[_BIG, 1]]],
    [[[-1, 0]]],
    [[[0.5, 1]]],
    [[[True, False]]],
    [[]],
    {"dtype": "uint8", "shape": [_BIG, 2, 2], "data": "AAAA"},
    {"dtype": "uint8", "shape": [0, 10**18, 10**18], "data": ""},
    {"dtype": "uint16", "shape": [2**31, 2**31, 2], "data": ""},
    {"dtype": "float64", "shape": [1, 1, 1], "data": "AAAAAAAAAAA="},
    {"dtype": "object", "shape": [1, 1, 1], "data": "AA=="},
    {"dtype": "uint8", "shape": [400, 1, 1], "data": "AAAA" * 100},
    {"rl": [float("nan")] * 3, "ce": [float("inf")] * 3},
    {"ce": "1.0"},
    {"start": _BIG, "end": -1},
    {"overlong_reward": float("nan")},
    ['{"shape": [1000000000000, 1000000000000], "dtype": "int8"}', ""],
    ['{"shape": [2, 2], "dtype": "float64"}', "AAAA"],
    ['{"shape": [2, 2], "dtype": "int64"}', "////////////////////////////////////////////"],
    ["{" + '"shape": ' + "[" * 3000 + "]" * 3000 + "}", "AAAA"],
    ['{"shape": [2, 2], "dtype": "int16", "x": "' + "a" * 20_000 + '"}', "AAAA"],
    ["{}", "AAAA"],
]
# hostile values of a `--context` option: out of range, not finite, too long, with escapes
CONTEXT_VALUES = ["0", "-1", "-64", "nan", "inf", "1e309", "9" * 30, "", "true", "\x1b[2J\n::error::x", "2.5"]


def _evidence_paths(rec: dict) -> list[tuple]:
    """The paths of a record under one of EVIDENCE_KEYS."""
    return [p for p in _paths(rec) if any(k in EVIDENCE_KEYS for k in p if isinstance(k, str))]


def evidence_case(seed: int) -> tuple[str, str, list[str], bytes]:
    """A framework, its fixture, the context and the bytes of a mutated dump of one of the EVIDENCE
    fixtures: one to three values set, removed or duplicated, mostly under the evidence's keys, from
    LEAVES and EVIDENCE_LEAVES; for some cases one context value hostile instead or as well."""
    import copy
    import random

    rng = random.Random(f"evidence:{seed}")
    fw, name, ctx = EVIDENCE[seed % len(EVIDENCE)]
    lines = [json.loads(x) for x in (DUMP_ROOT / fw / f"{name}.jsonl").read_text().splitlines() if x.strip()]
    ctx = list(ctx)
    if rng.random() < 0.2:
        k = rng.randrange(len(ctx))
        ctx[k] = ctx[k].split("=", 1)[0] + "=" + rng.choice(CONTEXT_VALUES)
    raws: list[str] = []
    for _ in range(rng.randint(0 if ctx != EVIDENCE[seed % len(EVIDENCE)][2] else 1, 3)):
        rec = rng.choice(lines)
        paths = _evidence_paths(rec) if rng.random() < 0.8 else _paths(rec)
        paths = paths or _paths(rec)
        if not paths:
            continue
        leaf = copy.deepcopy(rng.choice(EVIDENCE_LEAVES if rng.random() < 0.7 else LEAVES))  # never shared
        if isinstance(leaf, tuple):
            raws.append(leaf[1])
            leaf = _RAW.format(len(raws) - 1)
        _set(rec, rng.choice(paths), leaf, rng.choice(["set", "set", "set", "delete", "duplicate"]))
    text = "\n".join(json.dumps(x) for x in lines) + "\n"
    for i, raw in enumerate(raws):
        text = text.replace(json.dumps(_RAW.format(i)), raw)
    return fw, name, ctx, text.encode()


# the contract 1.3 columns (and the turn fields) an Arrow-level mutation of a converted fixture aims at
EVIDENCE_COLUMNS = [
    "routed_experts_version",
    "routed_experts_sha256",
    "loss_stream",
    "loss_weight",
    "overlong_penalty",
    "turns.top_k",
    "loss_mask",
    "token_source",
]


def _evidence_log(seed: int, work: Path) -> WorkflowCase:
    """`check LOG` on an EVIDENCE fixture converted clean, its 1.3 columns mutated at the Arrow level
    (`random_op`), with the trainer settings of the conversion as the log's own configuration."""
    import random

    from rollout_audit.adapters.convert import convert
    from rollout_audit.session.dumps import trainer_settings_table

    rng = random.Random(f"evidence-log:{seed}")
    fw, name, ctx = EVIDENCE[seed % len(EVIDENCE)]
    context = dict(kv.split("=", 1) for kv in [*DUMP_CONTEXT, *ctx])
    conv = convert(fw, [DUMP_ROOT / fw / f"{name}.jsonl"], context)
    trajectories, updates = conv.tables()
    log = work / "log"
    (log / "trajectories").mkdir(parents=True)
    table = trajectories
    for op in [random_op(rng, EVIDENCE_COLUMNS) for _ in range(rng.randint(1, 3))]:
        try:
            table = mutate(table, [op])
        except UnicodeDecodeError:  # an op that reads back a column made invalid UTF-8 by the one before
            continue
    pq.write_table(table, log / "trajectories" / "part-0000.parquet")
    if updates is not None:
        (log / "updates").mkdir()
        pq.write_table(updates, log / "updates" / "part-0000.parquet")
    (log / "pyproject.toml").write_text(trainer_settings_table(conv))
    # the formats that say on stderr why a log was not audited (text prints it in the report itself)
    fmt = rng.choice(["json", "json", "github", "junit"])
    return WorkflowCase("evidence", seed, ["check", str(log), "--format", fmt], [log], f"{fw}:{name}:log", fmt)


def prepare_evidence(seed: int, work: Path) -> WorkflowCase:
    """`check --from FW DUMP` (six cases in ten), `convert --from FW DUMP OUT` then `check OUT` (two in
    ten) on the mutated EVIDENCE dump of `seed` with its context, or `check LOG` on the fixture converted
    clean with its 1.3 columns mutated (two in ten, `_evidence_log`)."""
    import random

    pick = random.Random(f"evidence-command:{seed}").random()
    if pick >= 0.8:
        return _evidence_log(seed, work)
    fw, name, ctx, data = evidence_case(seed)
    dump = work / "dump.jsonl"
    dump.write_bytes(data)
    context = [x for kv in [*DUMP_CONTEXT, *ctx] for x in ("--context", kv)]
    label = f"{fw}:{name}"
    if pick < 0.6:
        args = ["check", "--from", fw, str(dump), *context, "--format", "json"]
        return WorkflowCase("evidence", seed, args, [dump], label, "json")
    out = work / "converted"
    follow = [FollowUp(["check", str(out), "--format", "json"], (0, 1), (0, 1, 2), "check of the converted log")]
    args = ["convert", "--from", fw, str(dump), str(out), *context]
    return WorkflowCase("evidence", seed, args, [dump], label, "text", follow, None, [work])


# ---------------------------------------------------------------- round 5: replay, vocabulary, hidden files, links

ROUND5 = ("replay", "vocabulary", "hidden", "convert_link", "template_path", "evidence")
_REPLAY_COLUMNS = ["token_ids", "behavior_logprobs", "token_source", "token_turn", "turns.top_p", "turns.temperature"]
_TEMPLATE_NAMES = ["a$1b", "${0}", "\\1", "$$", "%s{}", "a$&b", "$name"]


def _set_ids(t: pa.Table, rng) -> pa.Table:
    """A few token ids of the first file set to values past any vocabulary (or negative)."""
    ids = t.column("token_ids").combine_chunks()
    flat = pc.list_flatten(ids).to_numpy(zero_copy_only=False).astype("int64").copy()
    if not len(flat):
        return t
    for _ in range(rng.randint(1, 3)):
        flat[rng.randrange(len(flat))] = rng.choice([512, 10**6, 2**31 - 1, -1, 0])
    arr = pa.ListArray.from_arrays(ids.offsets, pa.array(flat, pa.int64()))
    return t.set_column(t.schema.get_field_index("token_ids"), "token_ids", arr)


def _compare_column(t: pa.Table, rng) -> tuple[pa.Table, str | None]:
    """A second log-prob column a configuration names: aligned, one entry short on a row, a scalar,
    lists of lists, or none at all (the name given, the column absent)."""
    how = rng.choice(["none", "aligned", "short", "scalar", "nested", "absent"])
    if how == "none":
        return t, None
    lp = t.column("behavior_logprobs").combine_chunks()
    if how == "aligned":
        col: pa.Array | None = lp
    elif how == "short":
        py = lp.to_pylist()
        k = rng.randrange(len(py))
        py[k] = (py[k] or [0.0])[:-1]
        col = pa.array(py, pa.list_(pa.float32()))
    elif how == "scalar":
        col = pa.array(range(t.num_rows), pa.int64())
    elif how == "nested":
        col = pa.array([[[0.0]] for _ in range(t.num_rows)])
    else:
        col = None
    return (t.append_column("old_logprobs", col) if col is not None else t), "old_logprobs"


def _write_first(log: Path, t: pa.Table, meta: dict | None = None) -> None:
    f = log / "trajectories" / "a.parquet"
    if meta:
        t = t.replace_schema_metadata({**(t.schema.metadata or {}), **meta})
    pq.write_table(t, f)


def prepare_round5(seed: int, work: Path, records) -> WorkflowCase:
    """One case of this round's surfaces, in turn by seed: replay of a mutated log by a numpy replayer
    (`fuzzreplay`) under a random `replay_max_bytes` and `compare_logprobs`; token ids against a
    declared (or configured) vocabulary; a log with a killed writer's hidden leftovers, checked
    itself or from the folder around it; `convert` to a symbolic link; a dump whose path reads
    like a replacement template; and the 1.3 evidence cases (`prepare_evidence`)."""
    import random
    import shutil

    rng = random.Random(f"round5:{seed}")
    what = ROUND5[seed % len(ROUND5)]
    fmt = rng.choice(["json", "json", "github", "junit"])  # formats that say on stderr why a log was not audited
    if what == "evidence":
        case = prepare_evidence(seed, work)
        case.kind, case.label = "round5", f"evidence:{case.label}"
        return case
    if what in ("replay", "vocabulary"):
        ops = [random_op(rng, _REPLAY_COLUMNS) for _ in range(rng.randint(0, 2))]
        log = build_log(work / "log", records, ops, [], ("none", 0))
        try:
            t = pq.read_table(log / "trajectories" / "a.parquet")
        except (pa.ArrowException, OSError):
            t = None
        lines = ["[tool.rollout-audit]"]
        meta = None
        if t is not None and "token_ids" in t.column_names and pa.types.is_list(t.schema.field("token_ids").type):
            try:
                t = _set_ids(t, rng)
            except (pa.ArrowException, ValueError, TypeError):
                pass
        if what == "replay":
            lines += [
                'replayer = "fuzzreplay:replayer"',
                f"replay_max_bytes = {rng.choice([1, 4096, 1 << 20, 1 << 30])}",
            ]
            if t is not None and "behavior_logprobs" in t.column_names:
                try:
                    t, name = _compare_column(t, rng)
                except (pa.ArrowException, ValueError, TypeError, IndexError):
                    name = None
                if name:
                    lines.append(f'compare_logprobs = "{name}"')
        else:
            size = rng.choice([1, 50, 300, 303, 304, 512, 10**5])
            vocab = rng.choice([["w"] * size, "not a list", [1, 2], [], ["\x1b[2J"] * size])
            meta = {b"rollout_log.tokenizer": json.dumps({"name": rng.choice(HOSTILE), "vocabulary": vocab}).encode()}
            if rng.random() < 0.3:
                lines.append(f"vocabulary_size = {rng.choice([1, 304, 10**6])}")
        if t is not None:
            _write_first(log, t, meta)
        cfg = work / "c.toml"
        cfg.write_text("\n".join(lines) + "\n")
        args = ["check", str(log), "--config", str(cfg), "--format", fmt]
        if what == "replay":
            args += ["--replay", str(rng.choice([1, 4, 64]))]
        return WorkflowCase("round5", seed, args, [log, cfg], what, fmt if fmt == "json" else "text")
    if what == "hidden":
        runs = work / "runs"
        log = build_log(
            runs / "log", records, [random_op(rng, TRAJ_COLUMNS)] if rng.random() < 0.3 else [], [], ("none", 0)
        )
        src = log / "trajectories" / "a.parquet"
        for left in rng.sample(["staged_dir", "temp_file", "spark", "hidden_file", "beside"], rng.randint(1, 3)):
            if left == "staged_dir":
                shutil.copytree(log / "trajectories", log / f".trajectories.{seed:08x}.tmp")
            elif left == "temp_file":
                data = src.read_bytes()
                (log / "trajectories" / f".a.parquet.{seed:08x}.tmp").write_bytes(data[: rng.randrange(len(data))])
            elif left == "spark":
                (log / "trajectories" / "_temporary" / "0").mkdir(parents=True)
                shutil.copy(src, log / "trajectories" / "_temporary" / "0" / "part-0.parquet")
            elif left == "hidden_file":
                shutil.copy(src, log / "trajectories" / ".a.parquet")
            else:
                shutil.copytree(log, runs / f".dst.{seed:08x}.tmp")
        target = rng.choice([log, runs])
        return WorkflowCase(
            "round5", seed, ["check", str(target), "--format", fmt], [runs], what, fmt if fmt == "json" else "text"
        )
    fw, dump = _dump_file(seed, work)
    if what == "template_path":
        where = work / rng.choice(_TEMPLATE_NAMES)
        where.mkdir()
        dump = Path(shutil.move(str(dump), where / dump.name))
        ctx = [x for kv in DUMP_CONTEXT for x in ("--context", kv)]
        args = ["check", "--from", fw, str(dump), *ctx, "--format", fmt]
        return WorkflowCase("round5", seed, args, [dump], what, fmt if fmt == "json" else "text")
    target = work / "elsewhere"
    kind = rng.choice(["empty", "dangling", "file", "full", "dump_dir"])
    if kind in ("empty", "full"):
        target.mkdir()
        if kind == "full":
            (target / "keep.txt").write_text("x")
    elif kind == "file":
        target.write_text("x")
    elif kind == "dump_dir":
        target = dump.parent
    link = work / "out" / "dst"
    link.parent.mkdir()
    link.symlink_to(target)
    ctx = [x for kv in DUMP_CONTEXT for x in ("--context", kv)]
    args = ["convert", "--from", fw, str(dump), str(link), *ctx]
    inputs = [dump] + ([target] if target.exists() and target != dump.parent else [])
    follow = [FollowUp(args, (0, 1), (), f"convert wrote through a link to {kind}")]
    return WorkflowCase("round5", seed, args, inputs, f"{what}:{kind}", "text", follow, None, [work], [link])
