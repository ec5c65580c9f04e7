"""Logs on object storage: bundled fixtures uploaded to an S3-compatible server (moto's, started
on loopback by the test) and audited through pyarrow's S3 client, which finds exactly what the
audit of the same files on disk finds."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

server_mod = pytest.importorskip("moto.server")

import pyarrow.fs as pafs  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from rollout_audit import audit  # noqa: E402
from rollout_audit.cli import main  # noqa: E402
from rollout_audit.contract.config import load_config  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LOGS = ("compliant", "broken/duplicate_shard_row", "broken/loss_over_whole_transcript", "broken/corrupt_file")
KEY = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def s3():
    """A bucket `logs` holding the fixtures, on a moto server; credentials and endpoint in the
    environment, as a user sets them."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # the server's request log
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {**KEY, "AWS_ENDPOINT_URL": endpoint}.items():
            mp.setenv(k, v)
        fs = pafs.S3FileSystem(
            access_key="testing",
            secret_key="testing",
            region="us-east-1",
            endpoint_override=endpoint,
            allow_bucket_creation=True,
        )
        fs.create_dir("logs")
        for name in LOGS:
            for f in sorted((FIXTURES / name).rglob("*.parquet")):
                with fs.open_output_stream(f"logs/{f.relative_to(FIXTURES).as_posix()}") as out:
                    out.write(f.read_bytes())
        # a killed writer's temp file and a stray non-log object beside a copy of the compliant log
        fs.copy_file("logs/compliant/trajectories/part-0000.parquet", "logs/extra/trajectories/part-0000.parquet")
        with fs.open_output_stream("logs/extra/trajectories/.part-0001.parquet.1f2e3d4c.tmp") as out:
            out.write(b"PAR1 half written")
        with fs.open_output_stream("logs/extra/notes.txt") as out:
            out.write(b"not a log")
        with fs.open_output_stream("logs/extra/trajectories/\x1b[2Jpart-0002.parquet") as out:
            out.write(b"PAR1 not parquet PAR1")  # a hostile key naming a corrupt object
        yield SimpleNamespace(fs=fs, endpoint=endpoint)
    server.stop()


def _on_s3(rep) -> list[dict]:
    """A report's findings with local fixture paths named as their uploaded objects."""
    rows = rep.findings.to_dicts()
    for r in rows:
        for k in ("file", "message"):
            if r[k]:
                r[k] = r[k].replace(f"{FIXTURES}/", "s3://logs/")
    return sorted(rows, key=json.dumps)


@pytest.mark.parametrize("name", LOGS)
def test_s3_log_has_the_findings_of_the_same_files_on_disk(s3, name):
    # an object store holds no configuration beside the log: the one found next to the files on
    # disk is given to the remote audit, as a user passes --config
    local = audit(FIXTURES / name)
    remote = audit(f"s3://logs/{name}/", config=load_config(start=FIXTURES / name))
    assert remote.findings.height == local.findings.height
    assert sorted(remote.findings.to_dicts(), key=json.dumps) == _on_s3(local)
    assert (remote.summary["counts"], remote.not_run, remote.partial) == (
        local.summary["counts"],
        local.not_run,
        local.partial,
    )
    assert remote.exit_code(False) == local.exit_code(False)
    if name != "compliant":
        assert remote.findings.height and remote.findings["file"].str.starts_with("s3://logs/").all()


def test_check_command_on_s3_uri_reports_s3_paths(s3):
    r = CliRunner().invoke(main, ["check", "s3://logs/broken/loss_over_whole_transcript", "--format", "json"])
    assert r.exit_code == 1, r.output
    files = {f["file"] for f in json.loads(r.stdout)["findings"]}
    assert files == {"s3://logs/broken/loss_over_whole_transcript/updates/updates.parquet"}


def test_temp_files_and_corrupt_objects_on_s3_are_findings(s3):
    rep = audit("s3://logs/extra")
    s005 = sorted(rep.findings.filter(rep.findings["code"] == "S005").to_dicts(), key=lambda f: f["file"])
    assert [f["file"] for f in s005] == [
        "s3://logs/extra/trajectories/\x1b[2Jpart-0002.parquet",
        "s3://logs/extra/trajectories/.part-0001.parquet.1f2e3d4c.tmp",
    ]
    assert "unfinished write" in s005[1]["message"]
    r = CliRunner().invoke(main, ["check", "s3://logs/extra", "--show-all"])
    assert r.exit_code == 1 and "\x1b" not in r.stdout and "\\x1b[2Jpart-0002.parquet" in r.stdout
    assert rep.summary["rows_read"] == pq.read_metadata(FIXTURES / "compliant/trajectories/part-0000.parquet").num_rows


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["s3://logs/compliant/", "-o", "s3://logs/compliant/report.json"], "never writes to its input"),
        (["s3://logs/compliant", "-o", "s3://logs/reports/r.json"], "local path"),
        (["s3://logs/no-such-run/"], "no such object or prefix"),
    ],
)
def test_unusable_s3_requests_exit_2_with_one_line(s3, args, says):
    r = CliRunner().invoke(main, ["check", *args])
    assert r.exit_code == 2, r.output
    assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not s3.fs.get_file_info("logs/compliant/report.json").is_file


def test_endpoint_in_the_uri_query(s3, monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    host = s3.endpoint.removeprefix("http://")
    rep = audit(f"s3://logs/broken/duplicate_shard_row?endpoint_override={host}&scheme=http")
    assert set(rep.findings["code"]) >= {"S002"}
    assert rep.findings["file"].str.starts_with("s3://logs/broken/duplicate_shard_row/").all()


def test_file_uri_is_the_local_path():
    local, uri = audit(FIXTURES / "broken/duplicate_shard_row"), audit(f"file://{FIXTURES}/broken/duplicate_shard_row")
    assert uri.findings.equals(local.findings) and uri.summary == local.summary
