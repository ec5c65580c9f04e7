"""The pipeline: the next batch decoded on Arrow's thread pool (a reader thread, a double buffer)
while the checks of the current batch run. It must change nothing but where the work runs: the
same batches, the same findings in the same order as on one thread and as one batch in memory."""

from __future__ import annotations

import threading

import faultgroups
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollout_audit.reading import io
from rollout_audit.reading.io import discover
from rollout_audit.running.concurrency import prefetch
from rollout_audit.running.engine import memory_discovery, run_audit
from rollout_audit.synth import make_log


@pytest.fixture(scope="module")
def base():
    return make_log(n_tasks=4, group_size=4, n_versions=2, seed=0)


@pytest.fixture
def pool_path(monkeypatch):
    """Every row group takes the decoding path of a large one (the fixtures' row groups are tiny)."""
    monkeypatch.setattr(io, "COLUMNWISE_BYTES", 0)
    monkeypatch.setattr(io, "_SMALL_ROW_GROUP", 0)


def _frames(rep) -> tuple[pl.DataFrame, dict, dict, dict]:
    return rep.findings, rep.summary["counts"], rep.not_run, rep.partial


def _per_file(rep) -> pl.DataFrame:
    """Findings without file names, sorted; a file-level finding (no trajectory) once: three
    files on disk are one table in memory, and messages name the files a finding is in."""
    f = rep.findings.drop("file").with_columns(pl.col("message").str.replace(r" \(in [^)]*\)$", ""))
    f = pl.concat(
        [f.filter(pl.col("trajectory_id").is_not_null()), f.filter(pl.col("trajectory_id").is_null()).unique()]
    )
    return f.sort(f.columns, nulls_last=True)


def _in_row_groups(root, rows: int) -> None:
    """Rewrite each trajectory file of the log under `root` in row groups of `rows` rows (its
    metadata kept)."""
    for p in (root / "trajectories").rglob("*.parquet"):
        t = pq.read_table(p)
        pq.write_table(t, p, row_group_size=rows)
        assert pq.ParquetFile(p).metadata.num_row_groups > 2


# the first group (eight faults) in the fast tier, all four in the full suite
GROUPS = [
    faultgroups.RECORD_GROUPS[0],
    *(pytest.param(g, marks=pytest.mark.slow) for g in faultgroups.RECORD_GROUPS[1:4]),
]


@pytest.mark.parametrize("group", GROUPS, ids=faultgroups.group_id)
def test_pipeline_finds_what_one_thread_and_memory_find(group, base, tmp_path, pool_path):
    """Named faults in three files of several row groups each: the pipeline's report equals the
    one-thread report finding for finding, in order, with the same counts, not-run and partial
    coverage, in row-group batches and in batches of 3 rows (several per row group); and the one
    batch in memory finds the same (once per file what is said of a file, file names aside)."""
    root = tmp_path / "log"
    faultgroups.write_group(root, group, *base, parts=3)
    _in_row_groups(root, 4)
    cfg = faultgroups.config(group)
    disc = discover([root])
    for rows in (2048, 3):
        pipe = run_audit(disc, cfg, batch_rows=rows)
        one = run_audit(disc, cfg, batch_rows=rows, pipeline=False)
        assert pipe.findings.height
        for a, b in zip(_frames(pipe), _frames(one)):
            assert a.equals(b) if isinstance(a, pl.DataFrame) else a == b, (a, b)
    traj = pa.concat_tables([pq.read_table(f.path) for f in disc.of_kind("trajectories")], promote_options="default")
    ups = [pq.read_table(f.path) for f in disc.of_kind("updates")]
    mem = run_audit(memory_discovery(traj, ups[0] if ups else None), cfg, batch_rows=10**9)
    assert _per_file(pipe).equals(_per_file(mem)), (pipe.findings, mem.findings)


def test_one_file_of_many_row_groups_in_the_same_order_as_in_memory(base, tmp_path, pool_path):
    """One file of many row groups, faults spread over them: the findings in the report's order
    are those of the same table audited as one batch in memory, row for row (the file's name,
    which in memory is `<memory>`, aside)."""
    group = faultgroups.RECORD_GROUPS[0]
    root = tmp_path / "log"
    faultgroups.write_group(root, group, *base)
    _in_row_groups(root, 3)
    cfg = faultgroups.config(group)
    disc = discover([root])
    (f,) = disc.of_kind("trajectories")
    mem_disc = memory_discovery(pq.read_table(f.path), pq.read_table(disc.of_kind("updates")[0].path))
    mem = run_audit(mem_disc, cfg, batch_rows=10**9)
    unnamed = lambda r: r.findings.drop("file").with_columns(
        pl.col("message").str.replace_all(f.path, "<memory>", literal=True)
    )
    for pipeline in (True, False):
        rep = run_audit(disc, cfg, pipeline=pipeline)
        assert unnamed(rep).height and unnamed(rep).equals(unnamed(mem)), (pipeline, rep.findings, mem.findings)
        assert rep.summary["counts"] == mem.summary["counts"] and rep.not_run == mem.not_run


def test_compliant_fixture_audits_alike_on_both_paths(pool_path):
    disc = discover(["fixtures/compliant"])
    pipe, one = run_audit(disc), run_audit(disc, pipeline=False)
    assert pipe.findings.equals(one.findings) and pipe.not_run == one.not_run
    assert pipe.summary["rows_read"] == one.summary["rows_read"] > 0


@pytest.mark.parametrize("piece", [1, 2, 3, None])
def test_pool_decoding_gives_the_tables_of_one_thread(base, tmp_path, pool_path, monkeypatch, piece):
    """Decoded on Arrow's pool `batch_rows` rows at a time, in pieces of `piece` rows that the
    batches' edges cut (None: each batch in one piece), a row group gives the same batches (first
    rows and tables, every column, the nested turns among them, one chunk per column) as a column
    at a time on one thread, however `batch_rows` falls against the row groups."""
    root = tmp_path / "log"
    faultgroups.write_group(root, faultgroups.RECORD_GROUPS[0], *base)
    _in_row_groups(root, 5)
    (f,) = discover([root]).of_kind("trajectories")
    if piece is not None:  # DECODE_BYTES that make pieces of `piece` rows of the largest group
        g = max(f.groups, key=lambda g: g.decoded)
        monkeypatch.setattr(io, "DECODE_BYTES", -(-piece * g.decoded // g.rows))
    for rows in (1, 2, 3, 4, 5, 7, 1 << 20):
        pool = list(io.iter_batches(f, f.schema.names, rows, threads=True))
        alone = list(io.iter_batches(f, f.schema.names, rows, threads=False))
        assert [o for o, _ in pool] == [o for o, _ in alone] and len(pool) >= 2
        for (_, a), (_, b) in zip(pool, alone):
            assert a.equals(b)
            assert all(c.num_chunks == 1 for c in a.columns)


def test_the_reader_holds_two_batches_at_most():
    """The double buffer: while the consumer holds batch i, the reader has made batch i+1 at most."""
    made = []
    lock = threading.Lock()

    def items():
        for i in range(20):
            with lock:
                made.append(i)
            yield i

    seen = []
    for x in prefetch(items()):
        with lock:
            assert max(made) <= x + 1, (x, made)
        seen.append(x)
    assert seen == list(range(20))


def test_a_reader_error_reaches_the_consumer_and_an_early_stop_ends_the_reader():
    def failing():
        yield 1
        raise OSError("disk gone")

    got = []
    with pytest.raises(OSError, match="disk gone"):
        for x in prefetch(failing()):
            got.append(x)
    assert got == [1]
    before = {t.ident for t in threading.enumerate() if t.name == "rollout-audit-reader"}
    stream = prefetch(iter(range(10**6)))
    assert next(stream) == 0
    stream.close()
    assert not {t.ident for t in threading.enumerate() if t.name == "rollout-audit-reader"} - before


def test_check_one_thread_reports_what_the_pipeline_reports(base, tmp_path, pool_path, monkeypatch):
    """`rollout-audit check --one-thread`: no reader thread and no decoding on Arrow's pool, and the
    same JSON report (exit 1 on the faults) as the default pipeline."""
    from click.testing import CliRunner

    from rollout_audit.cli.main import main
    from rollout_audit.running import executors

    root = tmp_path / "log"
    faultgroups.write_group(root, faultgroups.RECORD_GROUPS[0], *base)
    _in_row_groups(root, 3)
    runs = []
    real = executors.prefetch
    monkeypatch.setattr(executors, "prefetch", lambda items: runs.append(1) or real(items))
    pipe = CliRunner().invoke(main, ["check", str(root), "--format", "json"])
    assert runs == [1]
    one = CliRunner().invoke(main, ["check", str(root), "--format", "json", "--one-thread"])
    assert runs == [1]  # the one-thread audit read without the reader thread
    assert pipe.exit_code == one.exit_code == 1, (pipe.output, one.output)
    assert pipe.output == one.output and '"code": "M' in pipe.output


def test_spread_returns_every_result_in_order_and_raises_the_first_error():
    """The tasks of one batch on this thread and a helper: results in the tasks' order whichever
    thread ran each, every task run once, and the first failing task's error raised after all ran."""
    from concurrent.futures import ThreadPoolExecutor

    from rollout_audit.running.concurrency import spread

    seen: list[int] = []
    lock = threading.Lock()

    def task(i: int):
        def run() -> int:
            with lock:
                seen.append(i)
            if i in (3, 7):
                raise ValueError(f"task {i}")
            return i * i

        return run

    with ThreadPoolExecutor(1) as pool:
        assert spread([task(i) for i in (0, 1, 2, 4, 5)], pool) == [0, 1, 4, 16, 25]
        seen.clear()
        with pytest.raises(ValueError, match="task 3"):
            spread([task(i) for i in range(10)], pool)
        assert sorted(seen) == list(range(10))
    assert spread([task(2)], None) == [4]
