"""Mask and provenance (M): who generated each token, and what the trainer will learn from
(docs/checks.md, lesson “Who generated each token” and “Trainable-token masks and signal dilution”)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from ..contract import schema as S
from ..contract.digests import SCHEMES
from ..contract.registry import NotRun, rule
from ..frames import native
from ..frames.batch import as_bools, hex_digests
from ..frames.views import BatchView
from ..reading.arrays import fill_null, from_numpy, list_lengths, to_numpy, validity
from .common import NON_POLICY, ragged_index, source_breakdown, token_list, where_first


@rule(
    "M101",
    "loss_mask true on a token the policy did not sample",
    "error",
    requires=("loss_mask", "token_source"),
    optional=("token_turn", "loss_stream"),
)
def mask_on_non_policy(b: BatchView, cfg) -> pl.DataFrame | None:
    """loss_mask is true on a token the policy did not sample (system, user, tool/observation
    or template), counted per source.

    Lesson “Who generated each token” and “Trainable-token masks and signal dilution”: the policy chooses its action tokens but not the environment's
    reply. Only tokens with token_source = 2 (sampled by the behaviour policy) may enter the
    policy loss; training on a tool output or a chat-template token teaches the model to
    predict the environment and dilutes the gradient of its own actions. Build loss_mask as
    `token_source == 2` (or a subset of it), after the chat template and tool outputs have been
    inserted, not from message roles before templating. A user or observation token that the
    trainer puts in the echo loss stream (contract 1.3 loss_stream = 1: prime-rl's echo trains
    tool and user bodies on purpose with a cross-entropy loss of its own) is not counted here;
    M110 checks the streams.
    """
    if not b.ok.any() or not b.any_count(*(f"n_trainable_src{s}" for s, _ in NON_POLICY)):
        return None
    t = b.tokens
    bad = t.mask & ~t.policy
    if b.has("loss_stream") and bad.any():
        bad &= ~_echoed(b)
    if not bad.any():
        return None
    counts = b.traj.select("_row", *(f"n_trainable_src{s}" for s, _ in NON_POLICY))
    if b.has("loss_stream"):  # the echoed tokens are not counted: the breakdown is of `bad` itself
        per = np.bincount(t.row[bad] * 6 + np.minimum(t.source[bad], 5), minlength=b.n * 6).reshape(b.n, 6)
        counts = counts.with_columns(
            pl.Series(f"n_trainable_src{s}", per[counts["_row"].to_numpy(), s]) for s, _ in NON_POLICY
        )
    loc = b.locate(bad).join(counts, on="_row")
    return loc.select(
        "trajectory_id",
        "turn",
        "position",
        pl.format(
            "loss_mask true on {} non-policy token(s) ({}); expected 0; first at ",
            "n",
            source_breakdown("n_trainable_src"),
        )
        .add(where_first())
        .alias("message"),
    )


@rule(
    "M102",
    "policy-sampled token outside the loss mask",
    "warning",
    requires=("loss_mask", "token_source"),
    optional=("token_turn", "turns.finish_reason", "loss_excluded"),
    config=("masked_ok_reasons",),
)
def policy_not_masked(b: BatchView, cfg) -> pl.DataFrame | None:
    """A token the policy sampled has loss_mask false.

    Lesson “Trainable-token masks and signal dilution”: every sampled action token carries its share of the policy gradient; a
    policy token left out of the loss silently removes part of the action (often the tool-call
    arguments or the end-of-turn token, when the mask is built from message text). Some
    pipelines mask policy tokens on purpose, e.g. turns cut by the engine
    (finish_reason `length` or `abort`): declare those finish reasons in the configuration
    `masked_ok_reasons` and the turns are not reported. Otherwise set loss_mask true on every
    token with token_source = 2. An episode the trainer excludes from the loss as a whole
    (loss_excluded, contract 1.2: TRL's masked truncated completions) is not reported.
    """
    if not b.ok.any() or not b.any_count("n_policy_unmasked"):
        return None
    t = b.tokens
    bad = t.policy & ~t.mask
    if "loss_excluded" in b.columns:
        bad &= ~as_bools(b.col("loss_excluded"))[t.row]
    if not bad.any():
        return None
    tr = b.turns
    if cfg.masked_ok_reasons and len(tr) and "finish_reason" in tr.columns:
        excused = tr["finish_reason"].is_in(list(cfg.masked_ok_reasons)).fill_null(False).to_numpy()
        key = b.turn_key
        bad &= ~((key >= 0) & excused[np.maximum(key, 0)])
        if not bad.any():
            return None
    loc = b.locate(bad).join(b.traj.select("_row", "n_policy"), on="_row")
    return loc.select(
        "trajectory_id",
        "turn",
        "position",
        pl.format(
            "{} of {} policy-sampled token(s) have loss_mask false; expected all in the loss; first at ",
            "n",
            "n_policy",
        )
        .add(where_first())
        .alias("message"),
    )


@rule(
    "M103",
    "num_trainable_tokens differs from the recomputed count",
    "error",
    requires=("num_trainable_tokens", "loss_mask"),
)
def trainable_count(b: BatchView, cfg) -> pl.DataFrame | None:
    """The recorded num_trainable_tokens differs from the number of tokens with loss_mask true.

    Lesson “Trainable-token masks and signal dilution” and “Trajectory-, turn-, and token-level reduction”: the trainable-token count is the denominator of a token-level
    loss and the measure of signal dilution; when the pipeline's count disagrees with the
    mask it ships, either the mask or the normaliser is not the one that was intended.
    Recompute num_trainable_tokens from the final loss_mask (after templating and truncation).
    A null count is not compared (nothing was claimed).
    """
    t = b.traj
    maybe = ~(t["num_trainable_tokens"].to_numpy() == t["n_trainable"].to_numpy())  # a null reads as NaN
    if not maybe.any():
        return None
    bad = t.filter(pl.Series(maybe)).filter(
        pl.col("n_trainable").is_not_null()
        & pl.col("num_trainable_tokens").is_not_null()
        & (pl.col("num_trainable_tokens").cast(pl.Int64) != pl.col("n_trainable"))
    )
    return bad.select(
        "trajectory_id",
        pl.format(
            "num_trainable_tokens is {}, but loss_mask is true on {} token(s)", "num_trainable_tokens", "n_trainable"
        ).alias("message"),
    )


@rule(
    "M104",
    "turn num_policy_tokens differs from the recomputed count",
    "error",
    requires=("turns.num_policy_tokens", "token_source", "token_turn"),
)
def policy_token_count(b: BatchView, cfg) -> pl.DataFrame | None:
    """A turn's recorded num_policy_tokens differs from the number of tokens with
    token_source = 2 (policy) and token_turn = t.

    Lesson “Who generated each token” and “Log-probabilities must be captured at every turn”: per-turn log-probs, turn-level reductions and length penalties
    all use the number of tokens the policy sampled in the turn. A disagreement means the
    provenance tags or the turn tags were written from a different tokenization than the
    recorded turn. Tag every sampled token with token_source = 2 and its turn number, and count
    from those tags. Rows with malformed token lists (S003) and null counts are not compared.
    """
    tr = b.turns
    if not len(tr) or "rc_n_policy" not in tr.columns:
        return None
    maybe = ~(tr["num_policy_tokens"].to_numpy() == tr["rc_n_policy"].to_numpy())  # a null reads as NaN
    if not maybe.any():
        return None
    bad = tr.filter(pl.Series(maybe)).filter(
        pl.col("rc_n_policy").is_not_null()
        & pl.col("num_policy_tokens").is_not_null()
        & (pl.col("num_policy_tokens").cast(pl.Int64) != pl.col("rc_n_policy"))
    )
    return bad.select(
        "trajectory_id",
        pl.col("_t").alias("turn"),
        pl.col("rc_first_policy_pos").alias("position"),
        pl.format(
            "num_policy_tokens is {}, but {} token(s) have token_source policy and token_turn {}",
            "num_policy_tokens",
            "rc_n_policy",
            "_t",
        ).alias("message"),
    )


@rule(
    "M105",
    "token-in-token-out broken: engine context is not a prefix of the trainer's sequence",
    "error",
    requires=("token_ids", "token_source", "token_turn", "turns.context_length", "turns.context_sha256"),
)
def context_prefix(b: BatchView, cfg) -> pl.DataFrame | None:
    """The context the inference engine was given for turn t is not the prefix of the
    trainer's token_ids that ends just before the turn's first policy token.

    Lesson “Log-probabilities must be captured at every turn” (token in, token out): the behaviour log-probs are conditional on the exact
    ids the engine saw. The recorded context_length must equal the position of the turn's first
    policy token, and context_sha256 must equal the hex SHA-256 of token_ids[:context_length]
    as little-endian int32 bytes. A mismatch means the trainer rebuilt the sequence differently
    from what was sampled: a chat template re-applied, a separator dropped, earlier reasoning
    stripped, text re-tokenized. Build the training sequence by appending the engine's ids
    turn by turn instead of re-rendering the conversation. Turns with a null context_length
    or context_sha256 are not compared.
    """
    tr = b.turns
    if not len(tr) or "rc_first_policy_pos" not in tr.columns or b.tokens.ids is None:
        return None
    # per turn, in numpy: only the turns with a finding become a frame
    parent = b.turn_parent
    cl, has_cl = _ints(tr["context_length"])
    n_tok = b.lengths["token_source"][parent]
    keep = b.ok[parent] & has_cl
    in_range = (cl >= 0) & (cl <= n_tok)
    first_pol, has_first = _ints(tr["rc_first_policy_pos"])
    len_bad = has_first & (first_pol != cl)
    sha = _turn_field(b, "context_sha256")
    # incremental prefix hashes: one sha256 per trajectory, fed segment by segment in
    # increasing context_length; hexdigest() at each turn boundary works on a copy of the state
    todo = _prefix_order(np.flatnonzero(keep & in_range & validity(sha)), parent, cl)
    digests = b.tokens.prefix_digests(parent[todo], cl[todo])
    sha_bad = _differs(sha, todo, digests)
    bad_rows = np.flatnonzero(keep & (len_bad | sha_bad | ~in_range))
    if not bad_rows.size:
        return None
    at = np.full(len(tr), -1, np.int64)
    at[todo] = np.arange(todo.size)
    hashed = at[bad_rows] >= 0
    found = pl.Series("found", dtype=pl.String).extend_constant(None, bad_rows.size)
    found = found.scatter(np.flatnonzero(hashed), hex_digests(digests[at[bad_rows][hashed]]))
    bad = (
        tr[bad_rows]
        .select(
            "trajectory_id",
            "_t",
            pl.col("context_length").cast(pl.Int64).alias("cl"),
            pl.col("context_sha256").str.to_lowercase().alias("sha"),
            "rc_first_policy_pos",
            pl.Series("n_tok", n_tok[bad_rows]),
            pl.Series("in_range", in_range[bad_rows]),
            pl.Series("len_bad", len_bad[bad_rows]),
            pl.Series("sha_bad", sha_bad[bad_rows]),
            found.alias("found"),
        )
        .with_columns((pl.col("sha_bad") & ~pl.col("sha").str.contains("^[0-9a-f]{64}$")).alias("malformed"))
    )
    msg_len = (
        pl.when(~pl.col("in_range"))
        .then(pl.format("context_length {} lies outside the trajectory's {} tokens", "cl", "n_tok"))
        .when("len_bad")
        .then(
            pl.format(
                "context_length is {}, but the turn's first policy token is at position {}", "cl", "rc_first_policy_pos"
            )
        )
    )
    msg_sha = (
        pl.when(pl.col("malformed"))
        .then(pl.format("context_sha256 '{}' is not a 64-digit hex SHA-256", pl.col("sha").str.slice(0, 70)))
        .when("sha_bad")
        .then(
            pl.format(
                "sha256 of token_ids[:{}] is {}..., context_sha256 is {}...",
                "cl",
                pl.col("found").str.slice(0, 16),
                pl.col("sha").str.slice(0, 16),
            )
        )
    )
    return bad.select(
        "trajectory_id",
        pl.col("_t").alias("turn"),
        pl.coalesce("rc_first_policy_pos", pl.when(pl.col("in_range")).then("cl")).alias("position"),
        pl.concat_str([msg_len, msg_sha], separator="; ", ignore_nulls=True).alias("message"),
    )


def _prefix_order(todo: np.ndarray, rows: np.ndarray, length: np.ndarray) -> np.ndarray:
    """`todo` in (row, prefix length) order, the order incremental prefix hashing needs; turns
    logged in order are already in it, so the sort only runs when they are not."""
    r, c = rows[todo], length[todo]
    if todo.size > 1 and ((np.diff(r) < 0) | ((np.diff(r) == 0) & (np.diff(c) < 0))).any():
        return todo[np.lexsort((c, r))]
    return todo


def _differs(recorded: pa.Array, todo: np.ndarray, digests: np.ndarray) -> np.ndarray:
    """Per string of `recorded` (hex digests as logged, any case): whether the value at the indices
    `todo` differs from `digests` (null and malformed differ; strings outside `todo` are False).
    Compared as ASCII bytes in the native core: no string is built per turn."""
    bad = np.zeros(len(recorded), bool)
    if todo.size:
        if not (pa.types.is_string(recorded.type) or pa.types.is_large_string(recorded.type)):
            recorded = recorded.cast(pa.large_string())
        width = np.int64 if pa.types.is_large_string(recorded.type) else np.int32
        buf = recorded.buffers()
        at = recorded.offset * np.dtype(width).itemsize  # in bytes
        offsets = np.frombuffer(buf[1], width, len(recorded) + 1, at)
        data = np.frombuffer(buf[2], np.uint8) if buf[2] is not None else np.zeros(0, np.uint8)
        valid = validity(recorded) if recorded.null_count else None
        bad[todo] = native.hex_differs(offsets, data, valid, todo, digests)
    return bad


def _turn_field(b: BatchView, name: str) -> pa.Array:
    """One turn field as an Arrow array, one entry per turn (the order of `turns`)."""
    return pc.struct_field(b.col("turns").flatten(), name)


def _ints(s: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """An integer column as int64 values (-1 where null) and whether each is present."""
    s = s.cast(pl.Int64)
    if not s.null_count():
        return s.to_numpy(), np.ones(len(s), bool)
    return s.fill_null(-1).to_numpy(), s.is_not_null().to_numpy()


@rule(
    "M106",
    "the trainer's policy tokens differ from the engine's sampled_token_ids",
    "error",
    requires=("token_ids", "token_source", "token_turn", "turns.sampled_token_ids"),
)
def sampled_ids(b: BatchView, cfg) -> pl.DataFrame | None:
    """The policy tokens the trainer has for turn t (token_source = 2, token_turn = t, in
    position order) are not exactly the sampled_token_ids the inference engine returned.

    Lesson “Log-probabilities must be captured at every turn”: behaviour log-probs belong to the tokens that were sampled. When the
    trainer's sequence is re-tokenized from the decoded text, the same string can come back
    as different ids (merges across the boundary, normalised whitespace), and every
    probability ratio is then computed on tokens the behaviour policy never produced. Keep
    the engine's ids (token in, token out) and never round-trip actions through text. Turns
    with a null sampled_token_ids are not compared.
    """
    tr = b.turns
    if not len(tr) or "rc_n_policy" not in tr.columns or b.tokens.ids is None:
        return None
    samp = _turn_field(b, "sampled_token_ids")
    s_len = list_lengths(samp, -1)
    s_vals = samp.flatten()
    s_flat = to_numpy(fill_null(s_vals, -1))
    s_start = np.concatenate([[0], np.cumsum(np.maximum(s_len, 0))])[:-1]
    t = b.tokens
    index, n_p, p_start = b.policy_by_turn
    p_ids = t.ids[index]
    row_ok = b.ok[b.turn_parent]
    cmp = row_ok & (s_len >= 0)
    same_len = np.flatnonzero(cmp & (s_len == n_p))
    aligned = same_len.size == len(tr)  # every turn comparable: both sides already line up
    if aligned:
        diff = p_ids != s_flat
    else:
        ip, owner = ragged_index(p_start[same_len], n_p[same_len])
        is_, _ = ragged_index(s_start[same_len], n_p[same_len])
        diff = p_ids[ip] != s_flat[is_]
    out = []
    if diff.any():  # per turn with a difference: how many, and the first one
        if aligned:
            ip = is_ = np.arange(index.size)
            owner = np.repeat(np.arange(len(tr)), n_p)
        d = np.flatnonzero(diff)
        hit, first, n_diff = np.unique(owner[d], return_index=True, return_counts=True)
        k, first_k = same_len[hit], d[first]
        out.append(
            pl.DataFrame(
                {
                    "_k": k,
                    "position": t.pos[index[ip[first_k]]],
                    "n_diff": n_diff,
                    "n": n_p[k],
                    "off": ip[first_k] - p_start[k],
                    "trainer": p_ids[ip[first_k]],
                    "engine": s_flat[is_[first_k]],
                }
            ).select(
                "_k",
                "position",
                pl.format(
                    "the trainer's {} policy token(s) differ from sampled_token_ids at {} position(s); first at turn "
                    "offset {}: trainer has id {}, the engine sampled {}",
                    "n",
                    "n_diff",
                    "off",
                    "trainer",
                    "engine",
                ).alias("message"),
            )
        )
    wrong_len = np.flatnonzero(cmp & (s_len != n_p))
    if wrong_len.size:
        out.append(
            pl.DataFrame({"_k": wrong_len, "s": s_len[wrong_len], "n": n_p[wrong_len]}).select(
                "_k",
                pl.lit(None, pl.Int64).alias("position"),
                pl.format(
                    "the engine sampled {} token(s) (sampled_token_ids), the trainer has {} policy token(s) in this turn",
                    "s",
                    "n",
                ).alias("message"),
            )
        )
    if not out:
        return None
    found = pl.concat(out, how="vertical_relaxed")
    return found.join(
        tr.with_row_index("_k").select(pl.col("_k").cast(pl.Int64), "trajectory_id", "_t", "rc_first_policy_pos"),
        on="_k",
    ).select(
        "trajectory_id",
        pl.col("_t").alias("turn"),
        pl.coalesce("position", "rc_first_policy_pos").alias("position"),
        "message",
    )


@rule(
    "M107",
    "the trainer's context for a turn is not the chat template's render of the conversation",
    "warning",
    requires=(
        "token_ids",
        "token_source",
        "token_turn",
        "turns.template_context_length",
        "turns.template_context_sha256",
    ),
)
def template_context(b: BatchView, cfg) -> pl.DataFrame | None:
    """The trainer's token_ids before turn t's first policy token are not the chat template's
    render of the same conversation (template_context_length / template_context_sha256).

    Lesson “Log-probabilities must be captured at every turn” (token in, token out): building the
    sequence turn by turn keeps the engine and the trainer in agreement (M105), but each appended
    piece must also be what the template writes, or the policy is trained on contexts it will
    never see when deployed. A separator dropped at every assistant-to-tool boundary (the
    template writes `<|im_end|>\\n`, the incremental builder only `<|im_end|>`) shifts every later
    context by one token per turn. Render each appended message as the suffix of the full
    conversation's render, not in isolation. Templates that drop earlier reasoning also fire
    (a deliberate choice for some trainers): hence a warning. Turns with a null
    template_context_length are not compared.
    """
    tr = b.turns
    if not len(tr) or "rc_first_policy_pos" not in tr.columns or b.tokens.ids is None:
        return None
    parent = b.turn_parent
    tl, has_tl = _ints(tr["template_context_length"])
    pos, has_pos = _ints(tr["rc_first_policy_pos"])
    keep = b.ok[parent] & has_tl & has_pos
    same = tl == pos
    sha = _turn_field(b, "template_context_sha256")
    todo = _prefix_order(np.flatnonzero(keep & same & validity(sha)), parent, pos)
    sha_bad = _differs(sha, todo, b.tokens.prefix_digests(parent[todo], pos[todo]))
    bad_rows = np.flatnonzero(keep & (~same | sha_bad))
    if not bad_rows.size:
        return None
    bad = tr[bad_rows].select(
        "trajectory_id",
        "_t",
        pl.col("template_context_length").cast(pl.Int64).alias("tl"),
        pl.col("rc_first_policy_pos").cast(pl.Int64).alias("pos"),
    )
    return bad.select(
        "trajectory_id",
        pl.col("_t").alias("turn"),
        pl.col("pos").alias("position"),
        pl.when(pl.col("tl") != pl.col("pos"))
        .then(
            pl.format(
                "the trainer's context before this turn has {} tokens, the chat template renders the same "
                "conversation as {} ({} token(s) the trainer's sequence lacks or adds: a separator or header)",
                "pos",
                "tl",
                (pl.col("tl") - pl.col("pos")).cast(pl.String),
            )
        )
        .otherwise(
            pl.format("the trainer's context before this turn has the template's {} tokens but other ids", "pos")
        )
        .alias("message"),
    )


@rule(
    "M108",
    "episode split: an engine context did not extend the sequence so far",
    "warning",
    requires=("token_ids",),
    optional=("token_source", "split_from", "split_position", "split_sequence_id", "split_context_id"),
)
def split_episode(b: BatchView, cfg) -> pl.DataFrame | None:
    """The trainer split an episode: an engine call's context did not extend the sequence built
    so far, so a new segment (this trajectory) starts with that context (contract 1.2 split
    columns: split_position, where the context first differs, and the id each side has there).

    Lesson “Log-probabilities must be captured at every turn” (token in, token out): when an agent
    loop re-renders the conversation as text and the server tokenizes it again, the ids of an
    earlier turn change (retokenization drift), or a server returns a wrong id for a control
    token that the next context then corrects. A trainer that concatenates turns cannot put the
    new context after the old sequence; rLLM and prime-rl start a new sequence. That is faithful,
    but the behaviour log-probs of the earlier turns were taken under a context the policy will
    not see again, and the episode's credit is split across sequences. Recomputed from the
    segment: split_context_id is this trajectory's token_ids[split_position] (null when its first
    context ends there) and differs from split_sequence_id; evidence that does not hold is named.
    Keep the engine's ids from one turn to the next (pass the previous prompt and completion ids
    back instead of the text), or accept the split as the trainer's behaviour (ignore M108).
    """
    if "split_position" not in b.columns or b.col("split_position").null_count == b.n:
        return None
    t = b.tokens
    at = b.col("split_position")
    rows = np.flatnonzero(validity(at) & b.ok)  # malformed rows: S003
    pos = to_numpy(fill_null(at.cast(pa.int64()), -1))
    n_tok = t.n_tok[rows]
    p = pos[rows]
    # the first context of the segment: its tokens before the first policy token
    if "token_source" in b.lists:
        first_pol = np.full(b.n, -1, np.int64)
        fr, fp = b.first_position(t.policy)
        first_pol[fr] = fp
        ctx_len = np.where(first_pol[rows] >= 0, first_pol[rows], n_tok)
    else:
        ctx_len = n_tok
    inside = (p >= 0) & (p < ctx_len)
    got = np.full(rows.size, -1, np.int64)
    got[inside] = t.ids[t.starts[rows[inside]] + p[inside]]

    def ids(name: str) -> np.ndarray:
        if name not in b.columns:
            return np.full(rows.size, -1, np.int64)
        return to_numpy(fill_null(b.col(name).cast(pa.int64()), -1))[rows]

    had, ctx = ids("split_sequence_id"), ids("split_context_id")
    frm = b.col("split_from").cast(pa.string()).take(from_numpy(rows)) if "split_from" in b.columns else None
    df = pl.DataFrame(
        {
            "trajectory_id": b.ids.gather(rows),
            "split_from": pl.Series(frm if frm is not None else [None] * rows.size, dtype=pl.String),
            "position": p,
            "had": had,
            "ctx": ctx,
            "got": got,
            "ok": (p >= 0) & (p <= n_tok),
        }
    )
    claim = pl.format(
        "split from {} at position {}: the sequence so far had id {}, the next engine context had {}",
        pl.col("split_from").fill_null("(not named)"),
        "position",
        pl.when(pl.col("had") >= 0).then(pl.col("had").cast(pl.String)).otherwise(pl.lit("(not recorded)")),
        pl.when(pl.col("ctx") >= 0)
        .then(pl.format("id {}", pl.col("ctx").cast(pl.String)))
        .otherwise(pl.lit("ended there")),
    )
    wrong = (
        pl.when(~pl.col("ok"))
        .then(pl.lit("; split_position lies outside the trajectory's tokens"))
        .when(pl.col("got") != pl.col("ctx"))
        .then(
            pl.format(
                "; but this segment's context has {} there",
                pl.when(pl.col("got") >= 0)
                .then(pl.format("id {}", pl.col("got").cast(pl.String)))
                .otherwise(pl.lit("no token")),
            )
        )
        .when(pl.col("had") == pl.col("ctx"))
        .then(pl.lit("; but both ids are the same: the contexts do not differ there"))
        .otherwise(pl.lit(""))
    )
    return df.select(
        "trajectory_id",
        pl.when(pl.col("ok")).then("position").alias("position"),
        pl.concat_str([claim, wrong]).alias("message"),
    )


@rule(
    "M109",
    "episode excluded from the loss has trainable tokens",
    "error",
    requires=("loss_mask",),
    optional=("loss_excluded", "token_turn"),
)
def excluded_but_trained(b: BatchView, cfg) -> pl.DataFrame | None:
    """An episode recorded as excluded from the loss (loss_excluded, contract 1.2) has tokens
    with loss_mask true.

    Lesson “Success, termination, truncation, and infrastructure failure”: a trainer may keep an
    episode's reward in its group's statistics and train none of its tokens (TRL's
    mask_truncated_completions, SkyRL's overlong filtering, slime's removed samples); the
    audit then accepts its reward (T304) and its use in an update (U606) because nothing of it
    is trained. When its tokens still reach the loss, the cut-off completion is trained with a
    reward it did not earn. Zero the whole completion's mask where the exclusion is decided
    (after every later edit of the mask), or do not declare the episode excluded.
    """
    if "loss_excluded" not in b.columns:
        return None
    excluded = as_bools(b.col("loss_excluded"))
    if not b.ok.any() or not excluded.any():
        return None
    t = b.tokens
    bad = t.mask & excluded[t.row]
    if not bad.any():
        return None
    return b.locate(bad).select(
        "trajectory_id",
        "turn",
        "position",
        pl.format("loss_excluded is true, but loss_mask is true on {} token(s); expected none; first at ", "n")
        .add(where_first())
        .alias("message"),
    )


ECHO = 1  # loss_stream of the cross-entropy (echo) loss on environment text
ECHO_SOURCES = (1, 3)  # user and observation tokens: the text an echo stream may train


def _stream(b: BatchView) -> np.ndarray:
    """Per token: its loss_stream (0 where null or where the row's list does not line up)."""
    lst = token_list(b, "loss_stream")
    if lst.complete:
        return lst.values.astype(np.int64)
    return np.where(lst.present, np.nan_to_num(lst.values, nan=0.0), 0.0).astype(np.int64)


def _echoed(b: BatchView) -> np.ndarray:
    """Per token: trained on purpose in the echo stream (a user or observation token there)."""
    t = b.tokens
    return t.mask & (_stream(b) == ECHO) & _echo_source(t.source)


def _echo_source(source: np.ndarray) -> np.ndarray:
    """Per token: text an echo stream may train (user or observation)."""
    return (source == ECHO_SOURCES[0]) | (source == ECHO_SOURCES[1])


_STREAM_FINDINGS = (  # M110's findings per bit of `native.streams`: the stream's, then the weight's
    (native.ECHO_WRONG, "{} token(s) in the echo stream (1) that are not user or observation text; first at "),
    (
        native.UNKNOWN_STREAM,
        "{} trained token(s) in a loss stream the contract does not define (0 policy, 1 echo); first at ",
    ),
    (native.BAD_WEIGHT, "{} token(s) with a negative or non-finite loss_weight; first at "),
    (native.WEIGHT_OFF, "{} token(s) outside loss_mask with a positive loss_weight (trained anyway); first at "),
    (native.WEIGHT_DROPPED, "{} token(s) in loss_mask with loss_weight 0 (dropped silently); first at "),
)


@rule(
    "M110",
    "a loss stream's tokens or weights disagree with its purpose",
    "error",
    requires=("loss_mask", "token_source"),
    optional=("token_turn", "loss_stream", "loss_weight"),
)
def loss_streams(b: BatchView, cfg) -> pl.DataFrame | None:
    """A token's loss stream or weight (contract 1.3 loss_stream, loss_weight) disagrees with what
    the stream is for, or with loss_mask.

    Lesson “Who generated each token” and “Trainable-token masks and signal dilution”: a trainer
    may train more than the policy's own tokens on purpose, in a loss of their own: prime-rl's
    echo adds a cross-entropy stream on tool and user bodies, verifiers nodes carry per-token
    loss_weights. One mask cannot say which tokens go where; the streams can, and each has a
    purpose the tokens must fit. Stream 0, the policy-gradient loss, takes only tokens the
    policy sampled (token_source 2; M101 reports the others); stream 1, the echo loss, takes
    only user and observation tokens (source 1 or 3): a policy token there is trained twice, a
    template or system token teaches the chat format; any other stream value is unknown. A
    weight must be finite and never negative, positive where loss_mask is true and 0 elsewhere:
    a weight on a masked-out token trains it anyway, a zero weight on a trained token drops it
    silently. Build the streams from token_source after templating, as the mask is.
    """
    has_stream, has_weight = b.has("loss_stream"), b.has("loss_weight")
    if not (has_stream or has_weight):
        raise NotRun("columns loss_stream and loss_weight absent (the log records one loss stream: loss_mask)")
    if not b.ok.any():
        return None
    t = b.tokens
    lst = token_list(b, "loss_stream") if has_stream else None
    lw = token_list(b, "loss_weight") if has_weight else None
    bits, seen = native.streams(
        t.mask,
        t.source,
        None if lst is None else lst.stored,
        None if lst is None or lst.complete else lst.present,
        None if lw is None else lw.values,  # NaN where null or where the row's list does not line up
        None if lw is None or lw.complete else lw.present,
    )
    found = lambda codes: [_stream_finding(b, (bits & bit) != 0, what) for bit, what in codes if seen & bit]
    parts = [
        lst.bad if lst else None,
        *found(_STREAM_FINDINGS[:2]),
        lw.bad if lw else None,
        *found(_STREAM_FINDINGS[2:]),
    ]
    kept = [d for d in parts if d is not None and d.height]
    return pl.concat(kept, how="diagonal_relaxed") if kept else None


def _stream_finding(b: BatchView, where: np.ndarray, what: str) -> pl.DataFrame:
    idx = b.locate(where)
    src = b.tokens.source[b.tokens.starts[idx["_row"].to_numpy()] + idx["position"].to_numpy()].astype(np.int64)
    names = {**{k: v for k, v in NON_POLICY}, 2: "policy"}
    return idx.with_columns(pl.Series("_src", src)).select(
        "trajectory_id",
        "turn",
        "position",
        pl.format(what, "n")
        .add(where_first())
        .add(
            pl.format(
                " ({} token)",
                pl.col("_src").replace_strict(list(names), list(names.values()), default="invalid source"),
            )
        )
        .alias("message"),
    )


@rule(
    "M111",
    "a split exposes a trained token whose log-prob the engine recorded for another id",
    "error",
    requires=("token_ids", "loss_mask", "behavior_logprobs", "split_exposed_position", "split_exposed_logprob_id"),
    optional=("token_turn",),
)
def split_exposes_wrong_id(b: BatchView, cfg) -> pl.DataFrame | None:
    """A segment that a later split left trains, at the position the split exposed
    (split_exposed_position), an id other than the one the engine's own log-prob record names there
    (split_exposed_logprob_id), with that log-prob.

    Lesson “Log-probabilities must be captured at every turn” (token in, token out): a split (M108)
    says the next engine context did not extend the sequence so far. When the engine really sampled
    the id the sequence holds and the text was tokenized again differently (retokenization drift),
    the trained token and its log-prob belong together: M108 warns that the credit is split. When
    the engine's log-prob record names another id at that position, the server returned a wrong id
    for the token it sampled (microsoft/agent-lightning#326: vLLM's return_token_ids under streaming
    with a tool parser dropped or replaced control tokens), and the next context, rendered from the
    text, has the right one: the trainer trains the wrong id with the probability of the sampled
    one, a ratio of two different tokens, and runs collapse within a few steps. Recomputed on the
    row that trains the token: loss_mask true and a behaviour log-prob at split_exposed_position,
    and token_ids there differs from split_exposed_logprob_id (the id the engine's log-prob entry
    names, recorded from the engine's response, never from the mask). Without the log-prob record's
    id (null) nothing is claimed. Fix the server (vllm-project/vllm#29074) or take the sampled ids
    from the log-prob entries, and drop the affected turns.

    Which id an engine's log-prob entry names (read at the engines' source; docs/frameworks/openai.md
    cites the lines). vLLM's chat completions, streamed or not: the sampled one. Each entry is built
    from the engine's sampled ids (`output.token_ids`), as `token_id:N` with the request's
    `return_tokens_as_token_ids`, and a response's or a chunk's `token_ids` come from the same list;
    the tool parser rewrites text, never ids. Streamed with a tool parser (vLLM before 0.14), a chunk
    the parser holds back (a control token) is never sent, so its ids and its entries are missing
    together: the segment then holds no wrong id, the next context has the control token, and the
    split is M108 (the streamed usage's completion_tokens still counts the lost tokens). An entry
    that disagrees with the trained id was therefore not written so by vLLM: a client or proxy
    rebuilt the ids (from the text, or by filling the gap), and the trained id carries another
    token's log-prob, which is what this check reports. SGLang's OpenAI chat entries name no id (the
    decoded text only, streamed or not; streamed tool-call chunks carry no entries), so nothing is
    claimed there; its native /generate returns (log-prob, id, text) for each sampled id.
    """
    at, named = b.col("split_exposed_position"), b.col("split_exposed_logprob_id")
    if at.null_count == b.n or named.null_count == b.n or not b.ok.any():
        return None
    t = b.tokens
    pos = to_numpy(fill_null(at.cast(pa.int64()), -1))
    want = to_numpy(fill_null(named.cast(pa.int64()), -1))
    rows = np.flatnonzero(b.ok & (pos >= 0) & validity(at) & validity(named))
    if not rows.size:
        return None
    p = pos[rows]
    inside = p < t.n_tok[rows]
    g = t.starts[rows] + np.where(inside, p, 0)
    held = np.where(inside, t.ids[g].astype(np.int64), -1)
    trained = inside & t.mask[g] & t.lp_present[g]
    bad = trained & (held != want[rows])
    outside = ~inside
    if not (bad.any() or outside.any()):
        return None
    keep = bad | outside
    r = rows[keep]
    turn = t.turn[g[keep]].astype(np.int64) if "token_turn" in b.lists else np.full(r.size, -1, np.int64)
    df = pl.DataFrame(
        {
            "trajectory_id": b.ids.gather(r),
            "position": p[keep],
            "turn": pl.Series(turn).set(pl.Series((turn < 0) | outside[keep]), None),
            "held": held[keep],
            "named": want[r],
            "outside": outside[keep],
            "n_tok": t.n_tok[r].astype(np.int64),
        }
    )
    return df.select(
        "trajectory_id",
        pl.when(~pl.col("outside")).then("turn").alias("turn"),
        pl.when(~pl.col("outside")).then("position").alias("position"),
        pl.when(pl.col("outside"))
        .then(pl.format("split_exposed_position {} lies outside the segment's {} tokens", "position", "n_tok"))
        .otherwise(
            pl.format(
                "the split exposes position {}: the segment trains id {} there with the log-prob the engine "
                "recorded for id {} (the id its log-prob entry names): the server returned another id than it sampled",
                "position",
                "held",
                "named",
            )
        )
        .alias("message"),
    )


@rule(
    "M112",
    "a capture layer's digest of a call does not match the trainer's tokens",
    "error",
    requires=(
        "token_ids",
        "turns.context_length",
        "turns.sampled_token_ids",
        "turns.capture_digest",
        "turns.capture_digest_scheme",
    ),
    optional=("turns.context_sha256",),
)
def capture_digest(b: BatchView, cfg) -> pl.DataFrame | None:
    """The digest a capture layer stamped on an engine call when it returned (capture_digest, in the
    byte layout capture_digest_scheme names) is not the digest of the call's sequence as the trainer
    has it: token_ids[:context_length] followed by the turn's sampled_token_ids.

    Lesson “Log-probabilities must be captured at every turn” (token in, token out): a capture layer
    (NeMo Gym's token-id capture) hashes each call's ids before the response reaches the agent, so
    that whatever later carries them can be held to what the engine saw and returned. A mismatch
    means the ids changed after the capture hashed them (a parser rewrote a sampled id, a delta
    prompt was rebuilt onto the wrong parent, a record was edited in staging) or the layer's digest
    is wrong; either way the trainer's tokens at this call are not the ones the capture vouches for.
    Gym's own builder compares a child's prefix with its parent's recorded digest, never an entry's
    digest with its own tokens. Turns whose context_sha256 already differs from the trainer's prefix
    are M105's and not judged here; a turn with a null capture_digest is not compared.
    """
    tr = b.turns
    if not len(tr) or b.tokens.ids is None:
        return None
    have_sha = "context_sha256" in tr.columns
    tr = tr.filter(pl.col("capture_digest").is_not_null())
    if tr.is_empty():
        return None
    ids, starts, n_tok = b.tokens.ids, b.tokens.starts, b.tokens.n_tok
    out: list[dict] = []
    # one hash per turn that carries a capture digest (only capture layers write one)
    for r in tr.iter_rows(named=True):
        row, cl, sampled = r["_row"], r["context_length"], r["sampled_token_ids"]
        scheme, said = r["capture_digest_scheme"], r["capture_digest"].lower()
        at = {"trajectory_id": r["trajectory_id"], "turn": r["_t"], "position": cl}
        digest = SCHEMES.get(scheme)
        if digest is None:
            known = ", ".join(SCHEMES)
            out.append(at | {"message": f"capture_digest_scheme {scheme!r} is not one this audit recomputes ({known})"})
            continue
        if cl is None or sampled is None or not 0 <= cl <= n_tok[row]:
            continue  # no context or sampled ids to hash: M105 and M106 judge what is there
        context = ids[starts[row] : starts[row] + cl]
        if have_sha and r["context_sha256"] is not None and S.context_sha256(context) != r["context_sha256"].lower():
            continue
        try:
            found = digest(np.concatenate([context.astype(np.int64), np.asarray(sampled, np.int64)]))
            shown = f"{found[:16]}..."
        except ValueError:
            found, shown = "", "none (a negative id, which the scheme cannot encode)"
        if found != said:
            n = cl + len(sampled)
            out.append(
                at
                | {
                    "message": f"capture_digest {said[:16]}... ({scheme}) is not the digest of the call's {n} "
                    f"tokens as the trainer has them (context {cl}, then {len(sampled)} sampled): {shown}"
                }
            )
    return pl.DataFrame(out, schema={"trajectory_id": pl.String, "turn": pl.Int64, "position": pl.Int64,
                                     "message": pl.String}) if out else None  # fmt: skip
