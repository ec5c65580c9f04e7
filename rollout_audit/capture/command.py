"""The `rollout-audit capture` command: run the recorder until interrupted."""

from __future__ import annotations

import asyncio
import ipaddress
import sys

import click

from ..contract.version import __version__


@click.command("capture")
@click.option(
    "--upstream", required=True, help="The server to record (e.g. http://127.0.0.1:8000): every request goes there."
)
@click.option("--out", "out", required=True, type=click.Path(file_okay=False), help="Directory of the session files.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback unless told).")
@click.option("--port", default=8100, show_default=True, type=click.IntRange(0, 65535), help="Port (0: any free one).")
@click.option(
    "--max-body-bytes",
    default=64 << 20,
    show_default=True,
    type=click.IntRange(1),
    help="Largest request or response body recorded (and held in memory); a larger one is forwarded unchanged "
    "as it arrives, recorded without its body, and its session marked incomplete (not audited).",
)
@click.option("--connect-timeout", default=10.0, show_default=True, help="Seconds to reach the upstream (then 504).")
@click.option(
    "--read-timeout",
    default=600.0,
    show_default=True,
    help="Seconds the upstream may stay silent (then 504 or a cut stream).",
)
def capture(upstream, out, host, port, max_body_bytes, connect_timeout, read_timeout) -> None:
    """Record every exchange with an OpenAI-compatible server, passively, for `check --from openai`.

    \b
    Clients send to http://HOST:PORT/sessions/ID/v1 (or set the X-Rollout-Session header),
    set X-Weight-Version (or POST /capture/weight_version {"version": N}) and end each session
    with POST /sessions/ID/end {"stop_reason": ..., "reward": ...}. Then:
      rollout-audit check --from openai OUT
    """
    try:
        from .proxy import Recorder, serve
    except ImportError as e:  # aiohttp is the `capture` extra
        click.echo(f"rollout-audit: error: capture needs aiohttp (pip install 'rollout-audit[capture]'): {e}", err=True)
        sys.exit(2)
    if not upstream.startswith(("http://", "https://")):
        click.echo(f"rollout-audit: error: --upstream {upstream!r}: expected an http:// or https:// URL", err=True)
        sys.exit(2)
    if not _loopback(host):
        click.echo(
            f"rollout-audit capture: warning: listening on {host}, not loopback: anyone who reaches it is recorded",
            err=True,
        )
    recorder = Recorder(
        upstream,
        out,
        max_body=max_body_bytes,
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        version=__version__,
    )

    def ready(url: str) -> None:
        click.echo(f"rollout-audit capture: {url} -> {upstream}, sessions in {out}", err=True)

    try:
        asyncio.run(serve(recorder, host, port, ready))
    except KeyboardInterrupt:
        pass
    except OSError as e:
        click.echo(f"rollout-audit: error: capture: {e.strerror or e}", err=True)
        sys.exit(2)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
