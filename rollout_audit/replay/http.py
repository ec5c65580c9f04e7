"""Replay through an OpenAI-compatible completions endpoint (vLLM / SGLang style `prompt_logprobs`):
token ids in, the log-prob of every prompt token out. Standard library only (urllib)."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import numpy as np

from .base import NotConfigured, ReplayRequest, ReplayResult
from .dist import row_blocks, token_logprobs

MASS_TOL = 1e-3  # the returned distribution must be the whole vocabulary: its mass must reach 1 - MASS_TOL


MAX_VOCAB = 1 << 21  # a token id key at or past this is not a vocabulary entry (it would size the [N, V] array)
MIN_ENTRY_BYTES = 8  # the shortest answer for one prompt position: `{"0":0},`


class HTTPReplayer:
    """One server per policy version: `endpoints` maps a version to the server's base URL (…/v1).

    Every request has a connect deadline (`connect_timeout`, also the longest silence), a total
    deadline (`timeout`: a server that drips bytes is cut off) and a response size cap (`max_bytes`);
    the dense distributions scored at once hold about `max_scores` bytes at most."""

    def __init__(
        self,
        endpoints: dict[str, str],
        batch_size: int = 8,
        timeout: float = 300.0,
        connect_timeout: float = 10.0,
        max_bytes: int = 1 << 30,
        max_scores: int = 1 << 30,
    ) -> None:
        self.endpoints = endpoints
        self.batch_size = batch_size
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.max_bytes = max_bytes
        self.max_scores = max_scores

    def _fetch(self, url: str, body: dict | None = None) -> dict:
        """GET (or POST `body` as JSON) and parse the JSON answer within the deadlines and the size
        cap; any failure becomes NotConfigured naming the URL."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
        deadline = time.monotonic() + self.timeout
        watch = _Watch(self.timeout)
        try:
            with watch.opener.open(req, timeout=min(self.connect_timeout, self.timeout)) as resp:
                size = int(resp.headers.get("Content-Length") or 0)
                if size > self.max_bytes:
                    raise NotConfigured(f"replay endpoint {url} answered {size} bytes, over {self.max_bytes}")
                # one growing buffer, freed once decoded, and each distribution parsed into two arrays
                # (`_compact`): an answer costs a bounded multiple of its size (a dict per entry was 5x)
                buf, got = bytearray(), 0
                while True:
                    if time.monotonic() > deadline:
                        raise NotConfigured(f"replay endpoint {url} did not answer within {self.timeout:g} s")
                    chunk = resp.read1(1 << 16)  # each read waits at most connect_timeout
                    if not chunk:
                        break
                    got += len(chunk)
                    if got > self.max_bytes:
                        raise NotConfigured(f"replay endpoint {url} answered more than {self.max_bytes} bytes")
                    buf += chunk
            text = buf.decode("utf-8")
            del buf
            return json.loads(text, object_pairs_hook=_compact)
        except NotConfigured:
            raise
        except RecursionError:
            raise NotConfigured(f"replay endpoint {url} answered JSON nested too deeply") from None
        except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as e:
            if watch.fired.is_set():
                raise NotConfigured(f"replay endpoint {url} did not answer within {self.timeout:g} s") from None
            raise NotConfigured(f"replay endpoint {url} failed: {e}") from e
        finally:
            watch.cancel()

    def _post(self, url: str, body: dict) -> dict:
        """POST JSON, return JSON; a connection or HTTP error becomes NotConfigured with the URL."""
        return self._fetch(url, body)

    def _model_name(self, base: str) -> str:
        """The first model the server lists (GET /models)."""
        try:
            return str(self._fetch(base.rstrip("/") + "/models")["data"][0]["id"])
        except (KeyError, IndexError, TypeError) as e:
            raise NotConfigured(f"replay endpoint {base} lists no model: {e}") from e

    def _distributions(
        self, base: str, model: str, prompts: list[list[int]], want: list[np.ndarray]
    ) -> list[dict[int, _Dist | None]]:
        """For each prompt, {position: its base log-probs over the returned ids} at the wanted positions."""
        body = {"model": model, "prompt": prompts, "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": -1}
        out = self._post(base.rstrip("/") + "/completions", body)
        choices = sorted(out.get("choices", []), key=lambda c: c.get("index", 0))
        if len(choices) != len(prompts):
            raise NotConfigured(f"replay endpoint {base} answered {len(choices)} choices for {len(prompts)} prompts")
        try:
            return [{int(p): _dist(choice["prompt_logprobs"][int(p)]) for p in w} for choice, w in zip(choices, want)]
        except (KeyError, IndexError, TypeError) as e:
            raise NotConfigured(
                f"replay endpoint {base} answered no prompt_logprobs at a scored position: {e!r}"
            ) from e

    def replay(self, request: ReplayRequest) -> ReplayResult:
        """Full-vocabulary base log-probs from the server; temperature / top-k / top-p are applied here,
        `max_scores` bytes of dense distributions at a time."""
        base_url = self.endpoints.get(str(request.version))
        if base_url is None:
            raise NotConfigured(f"no replay endpoint configured for policy version {request.version}")
        batches = self._batches(request)  # a trajectory too long for the cap is refused before any request
        model = self._model_name(base_url)
        tokens = request.tokens
        sampled, base = np.full(len(tokens), np.nan), np.full(len(tokens), np.nan)
        for chunk in batches:
            lo, hi = chunk[0], chunk[-1] + 1
            sel = np.flatnonzero((request.traj >= lo) & (request.traj < hi))
            want = [request.position[sel][request.traj[sel] == i] for i in chunk]
            dists = self._distributions(base_url, model, [request.token_ids[i].tolist() for i in chunk], want)
            entries = [dists[t - lo][p] for t, p in zip(request.traj[sel].tolist(), request.position[sel].tolist())]
            del dists
            vocab = 1 + max((int(e.ids.max()) for e in entries if e is not None and e.ids.size), default=0)
            for part in row_blocks(len(sel), vocab, self.max_scores):
                rows = sel[part]
                z = _dense(entries[part], vocab)
                inside = tokens[rows] < vocab  # an id past every returned one has probability 0
                sampled[rows], base[rows] = token_logprobs(
                    z,
                    np.where(inside, tokens[rows], 0),
                    request.temperature[rows],
                    request.top_p[rows],
                    request.top_k[rows],
                    support=request.support_mask(rows, vocab),
                )
                sampled[rows[~inside]], base[rows[~inside]] = -np.inf, -np.inf
        return ReplayResult(sampled=sampled, base=base)

    def _batches(self, request: ReplayRequest) -> list[list[int]]:
        """Trajectories per request: at most `batch_size`, and prompts whose answer can fit `max_bytes`
        (every prompt position is answered with at least one entry of `MIN_ENTRY_BYTES`); a trajectory
        that alone cannot is refused, naming it, before anything is sent."""
        out: list[list[int]] = []
        room = 0
        for i, ids in enumerate(request.token_ids):
            need = len(ids) * MIN_ENTRY_BYTES
            if need > self.max_bytes:
                traj = request.rows.column("trajectory_id")[i].as_py() if request.rows.num_rows > i else i
                raise NotConfigured(
                    f"trajectory {traj} has {len(ids)} tokens: the endpoint's prompt_logprobs for it would exceed "
                    f"replay_max_response_bytes ({self.max_bytes}); replay it in process (replay_checkpoints) or "
                    "raise the cap"
                )
            if not out or len(out[-1]) >= self.batch_size or need > room:
                out.append([])
                room = self.max_bytes
            out[-1].append(i)
            room -= need
        return out


class _Dist:
    """One returned distribution: token ids and their base log-probs (two arrays, not a dict per entry)."""

    __slots__ = ("ids", "logprobs")

    def __init__(self, pairs: list[tuple[str, object]]) -> None:
        self.ids = np.fromiter((_token_key(k) for k, _ in pairs), dtype=np.int32, count=len(pairs))
        self.logprobs = np.fromiter((_logprob(v) for _, v in pairs), dtype=np.float64, count=len(pairs))


def _compact(pairs: list[tuple[str, object]]) -> object:
    """json object hook: a vLLM entry {"logprob": x, ...} becomes x; an object of numbers one of whose
    keys is not a name (a distribution over token ids) becomes a `_Dist`, validated as it is parsed;
    anything else stays a dict."""
    keys = [k for k, _ in pairs]
    if "logprob" in keys and not any(k.isdigit() for k in keys):
        return dict(pairs)["logprob"]
    if pairs and not all(k[:1].isalpha() or k[:1] == "_" for k in keys):
        return _Dist(pairs)
    return dict(pairs)


def _dist(entry: object) -> _Dist | None:
    """The distribution of one prompt position (None: the server returned none there)."""
    if entry is None or isinstance(entry, _Dist):
        return entry
    if isinstance(entry, dict):
        return _Dist(list(entry.items()))
    raise NotConfigured(f"replay endpoint returned {str(entry)[:40]!r} as a distribution")


def _dense(entries: list[_Dist | None], vocab: int) -> np.ndarray:
    """[N, vocab] base log-probs (-inf for ids the server did not return); checks the mass is complete."""
    z = np.full((len(entries), vocab), -np.inf)
    for i, e in enumerate(entries):
        if e is not None:
            z[i, e.ids] = e.logprobs
    mass = np.exp(z).sum(axis=1)
    if len(mass) and mass.min() < 1 - MASS_TOL:
        raise NotConfigured(
            f"replay endpoint returned partial distributions (mass {mass.min():.4f}): start it "
            "so that prompt_logprobs=-1 returns the whole vocabulary (vLLM: --max-logprobs)"
        )
    return z


class _Watch:
    """The total deadline of one request, status line and headers included: a per-read timeout
    never fires on a server that sends a byte a second, so at the deadline the connection's
    socket is shut down, which ends the read blocked on it."""

    def __init__(self, seconds: float) -> None:
        self.fired = threading.Event()
        self._conns: list[http.client.HTTPConnection] = []
        self._timer = threading.Timer(seconds, self._cut)
        self._timer.daemon = True
        self._timer.start()
        watch = self

        def keep(cls: type[http.client.HTTPConnection]):
            def make(host: str, **kw) -> http.client.HTTPConnection:
                conn = cls(host, **kw)
                watch._conns.append(conn)
                return conn

            return make

        class Plain(urllib.request.HTTPHandler):
            def http_open(self, req):
                return self.do_open(keep(http.client.HTTPConnection), req)

        class Secure(urllib.request.HTTPSHandler):
            def https_open(self, req):
                return self.do_open(keep(http.client.HTTPSConnection), req)  # the default context: certificates checked

        self.opener = urllib.request.build_opener(Plain(), Secure())

    def _cut(self) -> None:
        self.fired.set()
        for conn in self._conns:
            if conn.sock is not None:
                try:
                    conn.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # already closed

    def cancel(self) -> None:
        self._timer.cancel()


def _token_key(k: object) -> int:
    """A token id key of a returned distribution: a decimal integer in [0, MAX_VOCAB)."""
    text = str(k).strip()
    if not (text.isdigit() and len(text) < 10 and int(text) < MAX_VOCAB):
        raise NotConfigured(f"replay endpoint returned {text[:40]!r} as a token id (want 0 <= id < {MAX_VOCAB})")
    return int(text)


def _logprob(v: object) -> float:
    """The log-prob of a returned entry (a number, or {"logprob": number}): at most 0, -inf allowed."""
    x = v.get("logprob") if isinstance(v, dict) else v
    if isinstance(x, bool) or not isinstance(x, (int, float)) or np.isnan(x) or x > 1e-6:
        raise NotConfigured(f"replay endpoint returned {x!r} as a log-prob (want a number <= 0)")
    return float(x)
