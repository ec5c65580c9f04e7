"""Reward and credit (R): turn rewards, potential-based shaping, TD residuals and returns are
recomputed from the log and compared with what it records (docs/checks.md; lessons on credit assignment (“What one outcome reward provides” to “Potential-based reward shaping”)).

Discounting uses γ^t with t the turn index and γ the trajectory's `gamma` (1.0 when the
column or the value is absent). Sums over turns are computed per trajectory with one
`group_by("_row")` over the batch's turn frame. Values that are null are not compared
(nothing was claimed); NaN is compared and reported.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from ..contract import schema as S
from ..contract.registry import NotRun, rule
from ..frames import native
from ..frames.batch import as_bools, segment_sum, validity
from ..frames.views import BatchView, frame_of
from .common import beyond, may_differ, num, of_rows, stop_reason, token_list, tolerance

_G = pl.col("_gamma")
_GT = pl.col("_g_t")  # γ^t


def _off(found: pl.Expr, expected: pl.Expr, cfg) -> pl.Expr:
    """True where |found − expected| > atol + rtol·|expected| (NaN included); null → False."""
    return beyond(found, expected, cfg).fill_null(False)


def _discount(b: BatchView) -> list[pl.Series]:
    """`_gamma` (1.0 when absent or null), `_T` (turns in the trajectory) and `_g_t` = γ^t per
    turn: the same for every check of the batch that reads gamma (made once per batch)."""
    has_gamma = "gamma" in b.traj.columns

    def discount() -> list[pl.Series]:
        parent = b.turn_parent
        gamma = pc.fill_null(b.col("gamma").cast(pa.float64()), 1.0).to_numpy() if has_gamma else np.ones(b.n)
        g = pl.Series("_gamma", gamma[parent])
        return [g, pl.Series("_T", b.turn_counts[parent]), g.pow(b.turns["_t"]).alias("_g_t")]

    return b.shared("discount", ("gamma",) if has_gamma else (), discount)


def _turns(b: BatchView, *fields: str, traj: tuple[str, ...] = ()) -> pl.DataFrame:
    """The turn frame restricted to `fields` (`shaping` only when recorded), with `_gamma`,
    `_g_t` and `_T` (`_discount`), plus trajectory columns `traj` (gathered by `_row`, the
    turn's position in the batch)."""
    rows = b.turns["_row"]
    fields = tuple(dict.fromkeys(f for f in fields if f in b.turns.columns or f != "shaping"))
    cols = {c: b.turns.get_column(c) for c in ("_row", "_t", "trajectory_id", *fields)}
    cols.update((s.name, s) for s in _discount(b))
    cols.update((c, b.traj.get_column(c).gather(rows)) for c in traj)
    return frame_of(cols)


def _vals(s: pl.Series) -> np.ndarray:
    """A numeric column as float64 numpy, NaN where null (for the numpy test that selects rows)."""
    return s.cast(pl.Float64).to_numpy()


def _shaping_vals(b: BatchView) -> np.ndarray:
    """`_shaping` per turn as numpy: the recorded shaping, 0 where absent."""
    if "shaping" not in b.turns.columns:
        return np.zeros(len(b.turns))
    return b.turns["shaping"].cast(pl.Float64).fill_null(0.0).to_numpy()


def _per_row(b: BatchView, x: np.ndarray) -> np.ndarray:
    """Per batch row: the sum of the per-turn values `x` over its turns (0 without turns)."""
    return segment_sum(x, b.turn_start, b.turn_counts > 0, np.float64)


def _ends(b: BatchView) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows with turns, index of each one's first turn, of its last turn) in `turns`."""
    rows = np.flatnonzero(b.turn_counts > 0)
    first = b.turn_start[rows]
    return rows, first, first + b.turn_counts[rows] - 1


def _entries(dtype: pl.DataType) -> pl.Expr:
    """reward_components as list<struct{key, value}> (polars ≥ 2 reads Arrow maps as Map)."""
    c = pl.col("reward_components")
    if hasattr(pl, "Map") and isinstance(dtype, pl.Map):
        return c.map.entries()
    return c


def _shaping(b: BatchView) -> pl.Expr:
    """F_t as added to the reward: the recorded shaping, 0 where absent."""
    return pl.col("shaping").fill_null(0.0) if "shaping" in b.turns.columns else pl.lit(0.0)


@rule(
    "R401",
    "reward_components do not sum to the turn reward",
    requires=("turns.reward", "turns.reward_components"),
    optional=("turns.raw_reward",),
    config=("atol", "rtol"),
)
def components_sum(b: BatchView, cfg) -> pl.DataFrame | None:
    """A turn's reward_components do not sum to its reward (to its raw_reward where the log records
    the reward paid before the trainer normalised it).

    Lesson “Process feedback and hindsight critics”–“Verify world state, not persuasive text”: dense rewards are assembled from parts (outcome, verified
    milestones, process scores, penalties); the components are how a reward is audited for
    farming and first-visit rules. When they do not add up to the reward the trainer uses,
    either a component is missing from the log or the reward was changed after the
    components were recorded. A null component value counts as NaN. Write the reward as the
    sum of the logged components, at the same place. The components are what the environment paid:
    where a turn records raw_reward (contract 1.4, the reward before the trainer's normalisation)
    they are summed to it, and the trained reward is R417's to judge.
    """
    tr = b.turns
    if tr.is_empty():
        return None
    ent = _entries(tr.schema["reward_components"])
    paid = pl.coalesce("raw_reward", "reward") if "raw_reward" in tr.columns else pl.col("reward")
    df = (
        tr.select("trajectory_id", "_t", paid.alias("reward"), ent.alias("_e"))
        .filter(pl.col("_e").is_not_null() & pl.col("reward").is_not_null())
        .with_columns(
            pl.col("_e").list.eval(pl.element().struct.field("value").fill_null(float("nan"))).list.sum().alias("_sum"),
        )
    )
    bad = df.filter(_off(pl.col("_sum"), pl.col("reward"), cfg))
    if bad.is_empty():
        return None
    keys = pl.col("_e").list.eval(pl.element().struct.field("key").fill_null("null")).list.join(", ")
    return (
        bad.rechunk()
        .with_columns(keys.alias("_keys"))
        .select(
            "trajectory_id",
            pl.col("_t").alias("turn"),
            pl.format(
                "reward_components ({}) sum to {}, expected the turn reward {}",
                "_keys",
                num(pl.col("_sum")),
                num(pl.col("reward")),
            ).alias("message"),
        )
    )


@rule(
    "R402",
    "shaping term is not γΦ(s_{t+1}) − Φ(s_t)",
    requires=("turns.shaping", "turns.potential_before", "turns.potential_after"),
    optional=("gamma",),
    config=("atol", "rtol"),
)
def shaping_form(b: BatchView, cfg) -> pl.DataFrame | None:
    """A turn's shaping differs from γ·potential_after − potential_before.

    Lesson “Potential-based reward shaping”: potential-based shaping F(s_t, s_{t+1}) = γΦ(s_{t+1}) − Φ(s_t) preserves the
    optimal policies only when the term has exactly this form with the same γ as the return
    (gamma column, 1.0 when absent). A bonus for "useful-looking steps", a different γ, or a
    potential read from another state changes the objective and often creates a farmable
    loop. Compute the shaping from the two logged potentials with the trainer's γ.
    """
    if b.turns.is_empty():
        return None
    df = _turns(b, "shaping", "potential_before", "potential_after")
    with np.errstate(all="ignore"):  # inf and NaN are S001's findings; here they only select rows
        g, sh, before, after = (_vals(df[c]) for c in ("_gamma", "shaping", "potential_before", "potential_after"))
        maybe = may_differ(sh, g * after - before, cfg, np.abs(sh) + np.abs(g * after) + np.abs(before))
    if not maybe.any():
        return None
    exp = _G * pl.col("potential_after") - pl.col("potential_before")
    bad = df.filter(pl.Series(maybe)).filter(_off(pl.col("shaping"), exp, cfg))
    return bad.rechunk().select(
        "trajectory_id",
        pl.col("_t").alias("turn"),
        pl.format(
            "shaping {}, expected γΦ(s_t+1) − Φ(s_t) = {}·{} − {} = {}",
            num(pl.col("shaping")),
            num(_G),
            num(pl.col("potential_after")),
            num(pl.col("potential_before")),
            num(exp),
        ).alias("message"),
    )


@rule(
    "R403",
    "potential chain broken",
    requires=("turns.potential_before", "turns.potential_after"),
    config=("atol", "rtol"),
)
def potential_chain(b: BatchView, cfg) -> pl.DataFrame | None:
    """potential_after of turn t differs from potential_before of turn t+1.

    Lesson “Potential-based reward shaping”: s_{t+1} is both the state reached by turn t and the state turn t+1 starts
    from, so Φ(s_{t+1}) must be recorded once. When the two values differ the shaping terms
    no longer telescope (R404) and the sum of bonuses depends on the path, not only on the
    first and last state. Usually the potential is computed from the observation text, or
    before and after a state change that happens between turns. Compute Φ from the
    environment state at the turn boundary, once. The finding names turn t+1.
    """
    tr = b.turns
    if tr.is_empty():
        return None
    after = _vals(tr["potential_after"])
    maybe = (tr["_t"].to_numpy() > 0) & may_differ(_vals(tr["potential_before"]), np.r_[np.nan, after[:-1]], cfg)
    if not maybe.any():
        return None
    # turns are contiguous per trajectory and in order: a plain shift, masked at `_t == 0`, over
    # the trajectories with a turn that may differ
    df = (
        tr.filter(pl.Series(of_rows(b.turn_parent, b.turn_parent[maybe], b.n)))
        .select("trajectory_id", "_row", "_t", "potential_before", "potential_after")
        .with_columns(pl.col("potential_after").shift(1).alias("_prev_after"))
    )
    bad = df.filter((pl.col("_t") > 0) & _off(pl.col("potential_before"), pl.col("_prev_after"), cfg))
    return bad.rechunk().select(
        "trajectory_id",
        pl.col("_t").alias("turn"),
        pl.format(
            "potential_before {} differs from potential_after {} of turn {}",
            num(pl.col("potential_before")),
            num(pl.col("_prev_after")),
            pl.col("_t") - 1,
        ).alias("message"),
    )


@rule(
    "R404",
    "shaping does not telescope",
    requires=("turns.shaping", "turns.potential_before", "turns.potential_after"),
    optional=("gamma",),
    config=("atol", "rtol"),
)
def shaping_telescope(b: BatchView, cfg) -> pl.DataFrame | None:
    """Σ_t γ^t F_t differs from −Φ(s_0) + γ^T Φ(s_T).

    Lesson “Potential-based reward shaping”: with F_t = γΦ(s_{t+1}) − Φ(s_t) the discounted shaping terms telescope,
    so the whole bonus an episode collects is fixed by its first and last state; that is why
    shaping cannot be farmed. F_t is the recorded shaping, Φ(s_0) the first potential_before,
    Φ(s_T) the last potential_after. A failure means a shaping term is not a potential
    difference (R402), the chain of potentials is broken (R403), or the discount is applied
    inconsistently. Trajectories with a null shaping or potential are not compared.
    """
    if b.turns.is_empty():
        return None
    df = _turns(b, "shaping", "potential_before", "potential_after")
    with np.errstate(all="ignore"):
        g, g_t, sh, before, after = (
            _vals(df[c]) for c in ("_gamma", "_g_t", "shaping", "potential_before", "potential_after")
        )
        rows, first, last = _ends(b)
        found = _per_row(b, g_t * sh)[rows]
        exp = -before[first] + g[first] ** b.turn_counts[rows] * after[last]
        scale = _per_row(b, np.abs(g_t * sh))[rows] + np.abs(before[first]) + np.abs(exp + before[first])
        maybe = rows[may_differ(found, exp, cfg, scale)]
    if not maybe.size:
        return None
    df = df.filter(pl.Series(of_rows(b.turn_parent, maybe, b.n)))
    agg = df.group_by("_row", maintain_order=True).agg(
        pl.col("trajectory_id").first(),
        (_GT * pl.col("shaping")).sum().alias("_found"),
        (-pl.col("potential_before").first() + _G.first().pow(pl.len()) * pl.col("potential_after").last()).alias(
            "_exp"
        ),
        pl.len().alias("_T"),
        pl.sum_horizontal(pl.col("shaping", "potential_before", "potential_after").null_count()).alias("_nulls"),
    )
    bad = agg.filter((pl.col("_nulls") == 0) & _off(pl.col("_found"), pl.col("_exp"), cfg))
    return bad.rechunk().select(
        "trajectory_id",
        pl.format(
            "Σ γ^t shaping_t over {} turns = {}, expected −Φ(s_0) + γ^T Φ(s_T) = {}",
            "_T",
            num(pl.col("_found")),
            num(pl.col("_exp")),
        ).alias("message"),
    )


@rule(
    "R405",
    "terminal state with non-zero potential",
    requires=("terminated", "turns.potential_after"),
    config=("atol", "rtol"),
)
def terminal_potential(b: BatchView, cfg) -> pl.DataFrame | None:
    """A terminated episode ends in a state whose potential Φ(s_T) is not 0.

    Lesson “Potential-based reward shaping”: the shaping theorem needs boundary terms handled consistently. At a
    terminal state nothing follows, so Φ(s_T) must be 0; otherwise the telescoped bonus
    γ^T Φ(s_T) is paid on termination and rewards (or punishes) ending in that state, which
    changes the optimal policy — for instance, ending early in a high-potential state.
    Assign potential 0 to terminal states (truncated episodes keep theirs).
    """
    tr = b.turns
    if tr.is_empty():
        return None
    rows, _, end = _ends(b)
    end = end[as_bools(b.col("terminated"))[rows]]
    end = end[may_differ(_vals(tr["potential_after"])[end], np.zeros(end.size), cfg)]
    if not end.size:
        return None
    keep = np.zeros(len(tr), bool)
    keep[end] = True
    last = _turns(b, "potential_after").filter(pl.Series(keep)).filter(pl.col("_t") == pl.col("_T") - 1)
    term = b.traj.filter(pl.col("terminated").fill_null(False)).select("_row")
    bad = last.join(term, on="_row", how="semi").filter(_off(pl.col("potential_after"), pl.lit(0.0), cfg))
    return bad.rechunk().select(
        "trajectory_id",
        pl.col("_t").alias("turn"),
        pl.format(
            "terminated episode ends with potential_after {}, expected 0 at a terminal state",
            num(pl.col("potential_after")),
        ).alias("message"),
    )


@rule(
    "R406",
    "TD residuals do not telescope",
    requires=("turns.td_residual", "turns.value", "turns.reward", "final_value"),
    optional=("gamma", "turns.shaping"),
    config=("atol", "rtol"),
)
def td_residuals(b: BatchView, cfg) -> pl.DataFrame | None:
    """A recorded TD residual δ_t differs from r'_{t+1} + γV(h_{t+1}) − V(h_t), or
    Σ γ^t δ_t differs from G_0 − V(h_0) + γ^T V(h_T).

    Lesson “Turn returns and TD residuals”: δ_t = r_{t+1} + γV(h_{t+1}) − V(h_t), and without premature zeroing of the
    terminal value the residuals telescope to G_0 − V(h_0) + γ^T V(h_T). Here r' is the reward
    the trainer optimises, reward + shaping (shaping 0 when absent), G_0 = Σ γ^t r'_{t+1}, and
    V(h_T) is final_value (0 at a terminal state, the bootstrap value after truncation). A
    mismatch means the critic values, the rewards or the discount used by the trainer are not
    the ones logged (often: the last value zeroed on a truncated episode, or shaping left out).
    Each differing δ_t is reported at its turn; the sum is reported for a trajectory only when
    no single turn explains it.
    """
    if b.turns.is_empty():
        return None
    df = _turns(b, "td_residual", "value", "reward", "shaping", traj=("final_value",))
    with np.errstate(all="ignore"):
        g, g_t, td, value, final = (_vals(df[c]) for c in ("_gamma", "_g_t", "td_residual", "value", "final_value"))
        r = _vals(df["reward"]) + _shaping_vals(b)
        is_last = df["_t"].to_numpy() == df["_T"].to_numpy() - 1
        gv_next = g * np.where(is_last, final, np.r_[value[1:], np.nan])
        turn_maybe = may_differ(td, r + gv_next - value, cfg, np.abs(td) + np.abs(r) + np.abs(gv_next) + np.abs(value))
        rows, first, last = _ends(b)
        found = _per_row(b, g_t * td)[rows]
        gv_end = g[first] ** b.turn_counts[rows] * final[first]
        exp = _per_row(b, g_t * r)[rows] - value[first] + gv_end
        scale = _per_row(b, np.abs(g_t * td) + np.abs(g_t * r))[rows] + np.abs(value[first]) + np.abs(gv_end)
        row_maybe = rows[may_differ(found, exp, cfg, scale)]
    if not (turn_maybe.any() or row_maybe.size):
        return None
    keep = of_rows(b.turn_parent, row_maybe, b.n) | of_rows(b.turn_parent, b.turn_parent[turn_maybe], b.n)
    df = df.filter(pl.Series(keep)).with_columns((pl.col("reward") + _shaping(b)).alias("_r"))
    v_next = (
        pl.when(pl.col("_t") == pl.col("_T") - 1).then(pl.col("final_value")).otherwise(pl.col("value").shift(-1))
    )  # turns are contiguous per trajectory and in order
    df = df.with_columns(v_next.alias("_v_next")).with_columns(
        (pl.col("_r") + _G * pl.col("_v_next") - pl.col("value")).alias("_delta")
    )
    per_turn = df.filter(_off(pl.col("td_residual"), pl.col("_delta"), cfg))
    out = []
    if not per_turn.is_empty():
        out.append(
            per_turn.rechunk().select(
                "trajectory_id",
                pl.col("_t").alias("turn"),
                pl.format(
                    "td_residual {}, expected r' + γV(h_t+1) − V(h_t) = {} + {}·{} − {} = {}",
                    num(pl.col("td_residual")),
                    num(pl.col("_r")),
                    num(_G),
                    num(pl.col("_v_next")),
                    num(pl.col("value")),
                    num(pl.col("_delta")),
                ).alias("message"),
            )
        )
    agg = df.group_by("_row", maintain_order=True).agg(
        pl.col("trajectory_id").first(),
        (_GT * pl.col("td_residual")).sum().alias("_found"),
        (
            (_GT * pl.col("_r")).sum()
            - pl.col("value").first()
            + _G.first().pow(pl.len()) * pl.col("final_value").first()
        ).alias("_exp"),
        pl.sum_horizontal(pl.col("td_residual", "value", "_r", "final_value").null_count()).alias("_nulls"),
    )
    tel = agg.filter((pl.col("_nulls") == 0) & _off(pl.col("_found"), pl.col("_exp"), cfg)).join(
        per_turn.select("_row").unique(), on="_row", how="anti"
    )
    if not tel.is_empty():
        out.append(
            tel.rechunk().select(
                "trajectory_id",
                pl.format(
                    "Σ γ^t td_residual_t = {}, expected G_0 − V(h_0) + γ^T V(h_T) = {}",
                    num(pl.col("_found")),
                    num(pl.col("_exp")),
                ).alias("message"),
            )
        )
    return pl.concat(out, how="diagonal_relaxed") if out else None


@rule(
    "R407",
    "discounted_return differs from the recomputed return",
    requires=("discounted_return", "turns.reward"),
    optional=("gamma", "turns.shaping"),
    config=("atol", "rtol"),
)
def discounted_return(b: BatchView, cfg) -> pl.DataFrame | None:
    """The recorded discounted_return differs from Σ_t γ^t (reward_t + shaping_t).

    Lesson “A minimal formal model of an agent episode” and “Turn returns and TD residuals”: the objective is the discounted sum of the rewards the trainer
    optimises, here the turn rewards plus shaping (0 when absent), with γ the gamma column.
    A mismatch means the return used for advantages was computed with another γ, without
    shaping, or from rewards other than the logged ones. Trajectories with a null turn
    reward are not compared. Compute the return from the logged per-turn values.
    """
    if b.turns.is_empty():
        return None
    df = _turns(b, "reward", "shaping")
    with np.errstate(all="ignore"):
        g_r = _vals(df["_g_t"]) * (_vals(df["reward"]) + _shaping_vals(b))
        found = _vals(b.traj["discounted_return"])
        maybe = may_differ(found, _per_row(b, g_r), cfg, np.abs(found) + _per_row(b, np.abs(g_r)))
    if not maybe.any():
        return None
    df = df.filter(pl.Series(maybe[b.turn_parent])).with_columns((pl.col("reward") + _shaping(b)).alias("_r"))
    agg = df.group_by("_row").agg((_GT * pl.col("_r")).sum().alias("_ret"), pl.col("_r").null_count().alias("_nulls"))
    t = (
        b.traj.filter(pl.Series(maybe))
        .select("_row", "trajectory_id", "discounted_return")
        .join(agg, on="_row", how="left")
        .with_columns(pl.col("_ret").fill_null(0.0), pl.col("_nulls").fill_null(0))
    )
    bad = t.filter((pl.col("_nulls") == 0) & _off(pl.col("discounted_return"), pl.col("_ret"), cfg))
    return bad.rechunk().select(
        "trajectory_id",
        pl.format(
            "discounted_return {}, expected Σ γ^t (reward_t + shaping_t) = {}",
            num(pl.col("discounted_return")),
            num(pl.col("_ret")),
        ).alias("message"),
    )


def paid_once(cfg, meta, configured: frozenset[str]) -> dict:
    """R408's configuration from a file's metadata: the reward components its producer declares
    paid at most once join `first_visit_components`, unless the user's configuration sets it."""
    if "first_visit_components" in configured:
        return {}
    have = list(cfg.first_visit_components)
    once = sorted(k for k, v in S.reward_components(meta).items() if v in S.PAID_ONCE and k not in have)
    return {"first_visit_components": have + once} if once else {}


@rule(
    "R408",
    "first-visit reward component paid more than once",
    requires=("turns.reward_components",),
    config=("first_visit_components",),
    declare=paid_once,
)
def first_visit(b: BatchView, cfg) -> pl.DataFrame | None:
    """A reward component configured as first-visit is non-zero on more than one turn of an
    episode.

    Lesson “Verify world state, not persuasive text”: partial credit should reward a change of world state once ("the first
    successful login may be rewarded once; repeated login calls should not be paid
    repeatedly"); a milestone paid on every visit is farmed in a loop (lesson “Process feedback and hindsight critics”). Which
    components are first-visit is the producer's knowledge: its writer declares them in the file
    metadata `rollout_log.reward_components` (`RolloutWriter(reward_components={"key_picked":
    "first_visit"})`; "terminal" components are paid once too), and configuration
    `first_visit_components = ["key_picked", ...]` overrides it; with neither the check is
    reported as not run. Pay the component only on the transition that first reaches the state.
    """
    keys = list(cfg.first_visit_components)
    if not keys:
        raise NotRun(
            "needs first_visit_components in the configuration, or the log's rollout_log.reward_components metadata"
        )
    tr = b.turns
    if tr.is_empty():
        return None
    ent = _entries(tr.schema["reward_components"])
    paid = (
        tr.select("_row", "_t", "trajectory_id", ent.alias("_e"))
        .explode("_e")
        .drop_nulls("_e")
        .unnest("_e")
        .filter(pl.col("key").is_in(keys) & (pl.col("value").fill_null(0.0) != 0.0))
    )
    rep = (
        paid.group_by("_row", "key", maintain_order=True)
        .agg(
            pl.col("trajectory_id").first(),
            pl.col("_t").first().alias("_first"),
            pl.col("_t").slice(1, 1).first().alias("turn"),
            pl.len().alias("_n"),
            pl.col("_t").cast(pl.String).str.join(", ").alias("_turns"),
        )
        .filter(pl.col("_n") > 1)
    )
    return rep.rechunk().select(
        "trajectory_id",
        "turn",
        pl.format(
            "first-visit component '{}' paid on {} turns ({}), expected at most once", "key", "_n", "_turns"
        ).alias("message"),
    )


@rule("R409", "same action repeated in a loop", "warning", requires=("turns.parsed_action",), config=("loop_length",))
def action_loop(b: BatchView, cfg) -> pl.DataFrame | None:
    """The same parsed action is repeated `loop_length` (default 4) or more times in a row.

    Lesson “Process feedback and hindsight critics”–“Potential-based reward shaping”: a naive bonus for useful-looking steps, or a milestone that pays
    again, makes the agent repeat the paying action instead of finishing the task; a policy
    stuck on an unchanged observation does the same. Repeated identical calls in a row are
    the visible symptom. Turns whose action could not be parsed (null) break a run. Inspect
    the reward components of the repeated turns; make partial credit first-visit or
    potential-based, and give the environment a budget for repeated calls.
    """
    k = cfg.loop_length
    tr = b.turns
    if tr.is_empty():
        return None
    # turns are contiguous per trajectory: a run starts at turn 0 or a change; the trajectories
    # with a run long enough (usually none) are found in numpy
    act = pc.struct_field(b.col("turns").flatten(), "parsed_action")
    same = np.zeros(len(act), bool)
    same[1:] = as_bools(pc.equal(act[1:], act[:-1]))
    run = np.cumsum(~same | (tr["_t"].to_numpy() == 0))
    present = validity(act)
    counts = np.bincount(run[present], minlength=run.size + 1)
    long = present & (counts[run] >= k)
    if not long.any():
        return None
    df = (
        tr.filter(pl.Series(of_rows(b.turn_parent, b.turn_parent[long], b.n)))
        .select("_row", "_t", "trajectory_id", "parsed_action")
        .with_columns(
            ((pl.col("parsed_action") != pl.col("parsed_action").shift(1)).fill_null(True) | (pl.col("_t") == 0))
            .cum_sum()
            .alias("_run")
        )
    )
    runs = (
        df.filter(pl.col("parsed_action").is_not_null())
        .group_by("_run", maintain_order=True)
        .agg(
            pl.col("trajectory_id").first(),
            pl.col("parsed_action").first(),
            pl.col("_t").first().alias("turn"),
            pl.col("_t").last().alias("_last"),
            pl.len().alias("_n"),
        )
        .filter(pl.col("_n") >= k)
    )
    return runs.rechunk().select(
        "trajectory_id",
        "turn",
        pl.format(
            f"action {{}} repeated {{}} times in a row (turns {{}}–{{}}); loop_length is {k}",
            "parsed_action",
            "_n",
            "turn",
            "_last",
        ).alias("message"),
    )


@rule(
    "R410",
    "reward inconsistent with verifier_success",
    scope="log",
    requires=("task_id", "reward", "verifier_success"),
    config=("reward_rule", "atol", "rtol"),
    partition=("task_id",),
)
def reward_vs_verifier(log, cfg) -> pl.DataFrame | None:
    """The episode reward contradicts the verifier's verdict under the configured reward rule.

    Lesson “Verify world state, not persuasive text”: the reward should describe the change in the world that the verifier
    checks, not persuasive text. With `reward_rule = "monotone"` (default) no verified
    success may score below a verified failure of the same task (partial credit must not
    reorder the task's preferences); each offending trajectory is named with the one it is
    inverted against. With `reward_rule = "binary"` the reward is 1 on success and 0 on
    failure. Episodes with a null reward (excluded) or a null verdict are ignored. Fix the
    reward function, or the verifier, so that both describe the same world state.
    """
    t = log.traj.filter(pl.col("reward").is_not_null() & pl.col("verifier_success").is_not_null())
    if t.is_empty():
        return None
    ok = pl.col("verifier_success")
    if cfg.reward_rule == "binary":
        exp = pl.when(ok).then(1.0).otherwise(0.0)
        bad = t.filter(_off(pl.col("reward"), exp, cfg))
        return bad.rechunk().select(
            "trajectory_id",
            "file",
            pl.format(
                "reward {} with verifier_success {}, expected {} (reward_rule 'binary')",
                num(pl.col("reward")),
                ok.cast(pl.String).str.to_lowercase(),
                num(exp),
            ).alias("message"),
        )
    t = t.filter(~pl.col("reward").is_nan())
    r = pl.col("reward")
    s = (
        t.filter(ok)
        .sort("reward")
        .group_by("task_id")
        .agg(r.first().alias("_s_min"), pl.col("trajectory_id").first().alias("_s_id"))
    )
    f = (
        t.filter(~ok)
        .sort("reward", descending=True)
        .group_by("task_id")
        .agg(r.first().alias("_f_max"), pl.col("trajectory_id").first().alias("_f_id"))
    )
    t = t.join(s, on="task_id", how="inner").join(f, on="task_id", how="inner")
    tol = lambda x: tolerance(x, cfg)
    low = ok & (pl.col("_f_max") - r > tol(pl.col("_f_max")))
    high = ~ok & (r - pl.col("_s_min") > tol(pl.col("_s_min")))
    bad = t.filter(low | high)
    if bad.is_empty():
        return None
    msg = (
        pl.when(ok)
        .then(
            pl.format(
                "verified success scores {}, below verified failure {} of task {} (reward {}); "
                "expected no success below a failure (reward_rule 'monotone')",
                num(r),
                "_f_id",
                "task_id",
                num(pl.col("_f_max")),
            )
        )
        .otherwise(
            pl.format(
                "verified failure scores {}, above verified success {} of task {} (reward {}); "
                "expected no failure above a success (reward_rule 'monotone')",
                num(r),
                "_s_id",
                "task_id",
                num(pl.col("_s_min")),
            )
        )
    )
    return bad.rechunk().select("trajectory_id", "file", msg.alias("message"))


# ------------------------------------------------------------------ R411-R413: per-token rewards, KL and returns


def _findings(*parts: pl.DataFrame | None) -> pl.DataFrame | None:
    kept = [d for d in parts if d is not None and d.height]
    return pl.concat(kept, how="diagonal_relaxed") if kept else None


def _first(b: BatchView, where: np.ndarray, **per_token: np.ndarray) -> pl.DataFrame:
    """`b.locate(where)` with the first offending token's `_src` and each of `per_token` at it."""
    loc = b.locate(where)
    idx = b.tokens.starts[loc["_row"].to_numpy()] + loc["position"].to_numpy()
    extra = {"_src": b.tokens.source[idx].astype(np.int64), **{k: v[idx] for k, v in per_token.items()}}
    return loc.with_columns(pl.Series(k, v) for k, v in extra.items())


def _source_name() -> pl.Expr:
    names = {**S.SOURCE_NAMES, 5: "invalid source"}
    return pl.col("_src").replace_strict(list(names), list(names.values()), default="invalid source")


@rule(
    "R411",
    "reward placed on a token other than the last policy token of its turn",
    requires=("token_reward", "token_source", "token_turn"),
    optional=("reward",),
)
def reward_placement(b: BatchView, cfg) -> pl.DataFrame | None:
    """A non-zero token_reward (the task reward as the trainer placed it on tokens) sits on a
    token that is not the last policy token of its turn, or a non-zero episode reward is placed
    on no token at all.

    Lesson “What one outcome reward provides” gives the estimator R(τ)·Σ_t ∇log π(a_t | h_t): the
    outcome weighs the actions the policy took. The lesson is silent on tokens; the rule comes
    from huggingface/trl#3750, where the PPO score sat on the first padding token instead of the
    EOS: a token-level trainer must put the reward on the last token the policy sampled in the
    episode (a turn reward on the last one of its turn), from where the returns carry it back to
    the earlier actions. A reward on a token the policy never sampled, or in the middle of a
    turn, is credited through the value function to the wrong position, and a reward placed
    nowhere is lost. The last policy token of a turn is the last token with token_source 2 and
    that token_turn; a trainer that places only the episode reward uses the last one of the
    episode, which is also allowed here. A NaN placement is always a finding. Fix the index the
    trainer writes the score at (the position of the last sampled token, before padding), or
    record the placement it uses.
    """
    lst = token_list(b, "token_reward")
    t = b.tokens
    wrong, n_placed = native.placement(t.n_tok, t.source, t.turn, lst.values, lst.present)
    off = None
    if wrong.any():
        what = (
            pl.when(pl.col("_src") == S.POLICY)
            .then(pl.lit("a policy token that is not the last of its turn"))
            .otherwise(pl.format("a {} token the policy did not sample", _source_name()))
        )
        off = _first(b, wrong, _v=lst.values).select(
            "trajectory_id",
            "turn",
            "position",
            pl.format(
                "{} reward(s) placed off the last policy token of their turn; the first, {}, on {}",
                "n",
                num(pl.col("_v")),
                what,
            ).alias("message"),
        )
    lost = None
    if "reward" in b.traj.columns:
        rows = b.traj["_row"].to_numpy()
        lost = (
            b.traj.with_columns(pl.Series("_np", n_placed[rows]), pl.Series("_fits", lst.fits[rows]))
            .filter(pl.col("_fits") & (pl.col("_np") == 0) & ~(pl.col("reward").cast(pl.Float64) == 0).fill_null(True))
            .select(
                "trajectory_id",
                pl.format(
                    "episode reward {} is placed on no token (token_reward is 0 everywhere)", num(pl.col("reward"))
                ).alias("message"),
            )
        )
    return _findings(lst.bad, off, lost)


@rule(
    "R412",
    "KL penalty on a token the policy did not sample",
    requires=("token_kl", "token_source"),
    optional=("token_turn",),
)
def kl_on_non_policy(b: BatchView, cfg) -> pl.DataFrame | None:
    """token_kl (the per-token KL penalty the trainer subtracted from the reward) is non-zero on
    a token the policy did not sample (system, user, tool/observation or template token).

    Lesson “Trainable-token masks and signal dilution”: tokens the policy did not choose carry
    no log-ratio between policy and reference that the policy could change; a KL term on them
    is noise the returns then accumulate (THUDM/slime#1370: the KL of observation tokens
    summed into the returns of the policy tokens before them). The finding counts the tokens
    and names the source of the first. A NaN is a finding too. Fix the trainer to multiply the
    KL by the loss mask before it enters the reward (or record the KL it really used).
    """
    lst = token_list(b, "token_kl")
    wrong = lst.present & ~(lst.values == 0) & ~b.tokens.policy
    off = None
    if wrong.any():
        off = _first(b, wrong, _v=lst.values).select(
            "trajectory_id",
            "turn",
            "position",
            pl.format(
                "KL penalty on {} token(s) the policy did not sample; the first, {}, on a {} token",
                "n",
                num(pl.col("_v")),
                _source_name(),
            ).alias("message"),
        )
    return _findings(lst.bad, off)


@rule(
    "R413",
    "per-token returns do not telescope over the policy tokens",
    requires=("token_returns", "token_reward", "token_source"),
    optional=("token_kl", "token_turn"),
    config=("atol", "rtol"),
)
def token_returns(b: BatchView, cfg) -> pl.DataFrame | None:
    """On a policy token, the recorded token_returns differs from the reward-to-go over the
    policy tokens: G_k = Σ_{j ≥ k, token_source_j = 2} (token_reward_j − token_kl_j).

    Lesson “What one outcome reward provides”: a return is the sum of the rewards of this and
    the later actions; only policy tokens are actions, so the returns telescope over them
    (G_k − G_next = r_k, with next the following policy token, and G = r on the last one),
    and a token the policy did not sample contributes nothing. A trainer that runs the
    return recursion over every position (THUDM/slime#1370: KL of tool tokens accumulated into
    the returns) or restarts it at a turn boundary gives returns that do not telescope; the
    finding names the first policy token that differs, and says when the recorded value is the
    sum over every token instead. token_kl counts 0 where null or absent; returns on other
    tokens are not read; rows whose lists do not line up with their tokens are not compared.
    Compared within atol + rtol·|G|. Fix the return computation to skip (mask) the tokens the
    policy did not sample.
    """
    ret, rew = token_list(b, "token_returns"), token_list(b, "token_reward")
    rows = ret.fits & rew.fits
    kl = token_list(b, "token_kl") if b.has("token_kl") else None
    if kl is not None:
        rows &= ~kl.broken

    def term(at: np.ndarray) -> np.ndarray:
        """reward − KL at the token indices `at` (a null counts 0)."""
        return native.terms(
            at,
            rew.values,
            None if rew.complete else rew.present,
            None if kl is None else kl.values,
            None if kl is None or kl.complete else kl.present,
        )

    t = b.tokens
    pol = t.policy_index
    if not rows.all():
        pol = pol[rows[t.row[pol]]]
    g = ret.values
    within = lambda e, at: ~beyond(g[at], e, cfg)
    expected = native.to_go(term(pol), t.row[pol])
    bad = ~within(expected, pol)
    if not ret.complete:
        bad &= ret.present[pol]
    off = None
    if bad.any():
        # the return over every token (the finding says when that is what was recorded), on the
        # rows with a differing token only
        every = np.flatnonzero(rows[t.row] & np.isin(t.row, t.row[pol[bad]]))
        e, summed, wrong = np.full(t.row.size, np.nan), np.zeros(t.row.size, bool), np.zeros(t.row.size, bool)
        e[pol], summed[every], wrong[pol[bad]] = expected, within(native.to_go(term(every), t.row[every]), every), True
        off = _first(b, wrong, _g=g, _e=e, _all=summed).select(
            "trajectory_id",
            "turn",
            "position",
            pl.format(
                "token_returns differ from the reward-to-go over the policy tokens on {} policy token(s); "
                "the first is {}, expected {}{}",
                "n",
                num(pl.col("_g")),
                num(pl.col("_e")),
                pl.when(pl.col("_all"))
                .then(pl.lit(": it is the sum over every token, the ones the policy did not sample included"))
                .otherwise(pl.lit("")),
            ).alias("message"),
        )
    return _findings(ret.bad, rew.bad, None if kl is None else kl.bad, off)


# ------------------------------------------------------------------ R414: the overlong penalty


@rule(
    "R414",
    "overlong penalty differs from the one recomputed from the policy tokens",
    "error",
    requires=("overlong_penalty", "token_source"),
    config=("max_response_tokens", "overlong_buffer", "overlong_penalty_factor", "atol", "rtol"),
)
def overlong_penalty(b: BatchView, cfg) -> pl.DataFrame | None:
    """The recorded overlong penalty (contract 1.3 overlong_penalty) differs from the DAPO-style
    soft penalty recomputed from the episode's policy tokens.

    Lesson “Trainable-token masks and signal dilution” and “What one outcome reward provides”: a
    soft overlong penalty punishes the policy for the length of what it generated. With budget
    L = max_response_tokens, buffer B = overlong_buffer and factor f = overlong_penalty_factor,
    the expected penalty of an episode whose policy sampled n tokens (token_source = 2) is
    min(0, −(n − (L − B)) / B · f). Counting the tool outputs and templates between the agent's
    turns as response length (OpenRLHF#1243, #1252) punishes an agent for what its tools
    returned, and the penalty grows with every tool call. Compute the length from the policy
    tokens. Runs when the three values are configured (a log may state them: they say how the
    run was produced); episodes with a null penalty are not compared.
    """
    cut, buf, factor = cfg.max_response_tokens, cfg.overlong_buffer, cfg.overlong_penalty_factor
    if cut is None or buf is None or factor is None:
        raise NotRun("needs max_response_tokens, overlong_buffer and overlong_penalty_factor in the configuration")
    t = b.tokens
    n = np.bincount(t.row[t.policy], minlength=b.n)
    df = b.traj.select("trajectory_id", "_row", pl.col("overlong_penalty").cast(pl.Float64)).with_columns(
        pl.Series("n", n[b.traj["_row"].to_numpy()]),
        pl.Series("ok", b.ok[b.traj["_row"].to_numpy()]),
    )
    expected = pl.min_horizontal(pl.lit(0.0), -(pl.col("n") - (cut - buf)).cast(pl.Float64) / buf * factor)
    df = df.with_columns(expected.alias("_exp"))
    bad = df.filter(
        pl.col("ok") & pl.col("overlong_penalty").is_not_null() & _off(pl.col("overlong_penalty"), pl.col("_exp"), cfg)
    )
    return bad.select(
        "trajectory_id",
        pl.format(
            "overlong_penalty {} recorded, expected {} = min(0, −({} policy tokens − ({} − {})) / {} × {})",
            num(pl.col("overlong_penalty")),
            num(pl.col("_exp")),
            "n",
            pl.lit(cut),
            pl.lit(buf),
            pl.lit(buf),
            pl.lit(factor),
        ).alias("message"),
    )


@rule(
    "R415",
    "terminated episode bootstraps from a non-zero final_value",
    requires=("terminated", "final_value"),
    optional=("stop_reason",),
    config=("atol", "rtol"),
    preview=True,
)
def terminal_value(b: BatchView, cfg) -> pl.DataFrame | None:
    """A terminated episode records a critic value V(h_T) = final_value other than 0.

    Lessons “Success, termination, truncation, and infrastructure failure” and “Turn returns
    and TD residuals”: a terminal state has no future, so its value is 0 and only a truncated
    episode bootstraps from V(h_T) (the contract: final_value is 0 at a terminal state). A
    non-zero final_value on a terminated episode means the trainer bootstrapped through the
    end of the task (the done flag was not applied to the last TD residual or return): every
    advantage of the episode then credits or blames its actions for value that was never
    reachable. The TD identity (R406) still holds with the wrong V(h_T), so only this check sees
    it. Null final_value is not compared; NaN is reported. Compared within atol. Fix the
    advantage computation to use V(h_T) = 0 when the episode terminated.
    """
    fv = b.col("final_value").cast(pa.float64())
    # in numpy, the terminated rows whose recorded value may differ from 0 (usually none)
    maybe = as_bools(b.col("terminated")) & validity(fv)
    vals = pc.fill_null(fv, 0.0).to_numpy(zero_copy_only=False)
    maybe &= may_differ(vals, np.zeros(b.n), cfg)
    if not maybe.any():
        return None
    reason = stop_reason(b)
    t = b.traj.filter(pl.Series(maybe)).select("trajectory_id", "final_value", reason)
    bad = t.filter(_off(pl.col("final_value").cast(pl.Float64), pl.lit(0.0), cfg))
    return bad.rechunk().select(
        "trajectory_id",
        pl.format(
            "terminated episode (stop_reason {}) has final_value {}, expected 0: a terminal state has no "
            "value to bootstrap from",
            pl.col("stop_reason").fill_null("null"),
            num(pl.col("final_value")),
        ).alias("message"),
    )


# ------------------------------------------------------------------ R416: GAE over the trainable tokens

F32_SLACK = 2.0**-16  # float32 targets: a relative allowance on the magnitudes they were computed from


def discounted_to_go(x: np.ndarray, c: np.ndarray) -> np.ndarray:
    """y_i = x_i + c_i·y_{i+1} in float64, y = x where c_i = 0 (the last element of each segment must
    have c 0). Vectorised by recursive doubling: after the step of span s each y_i holds the terms
    of the next 2s elements and `a` their carried factor; ⌈log2⌉ of the longest segment steps, each
    over the whole array. Factors in [0, 1] only shrink, so nothing overflows."""
    y = np.asarray(x, np.float64).copy()
    a = np.asarray(c, np.float64).copy()
    n, s = y.size, 1
    with np.errstate(all="ignore"):
        while s < n and a.any():
            carry = a[:-s] != 0  # no carry where the factor is 0: a NaN of the next segment stays there
            y[:-s] += np.multiply(a[:-s], y[s:], out=np.zeros(n - s), where=carry)
            a[:-s] = np.multiply(a[:-s], a[s:], out=np.zeros(n - s), where=carry)
            a[n - s :] = 0.0  # a window past the array's end holds its last element, whose factor is 0
            s *= 2
    return y


def _row_floats(b: BatchView, name: str, default: float) -> np.ndarray:
    """A trajectory column as float64 per batch row, `default` where absent or null."""
    if name not in b.traj.columns:
        return np.full(b.n, default)
    return pc.fill_null(b.col(name).cast(pa.float64()), default).to_numpy(zero_copy_only=False)


@rule(
    "R416",
    "GAE targets differ from GAE recomputed over the trainable tokens",
    "error",
    requires=("token_values", "token_value_targets", "token_reward", "gae_lambda", "loss_mask", "token_source"),
    optional=("token_kl", "gamma", "final_value", "token_turn"),
    config=("atol", "rtol"),
)
def gae_targets(b: BatchView, cfg) -> pl.DataFrame | None:
    """On a trainable token, the recorded GAE target (token_value_targets, A + V) differs from GAE
    recomputed over the trainable tokens from the rewards, the critic's values, gamma and
    gae_lambda.

    Lesson “Turn returns and TD residuals”: with k and k' consecutive tokens of loss_mask true,
    δ_k = r_k + γ·V_k' − V_k and A_k = δ_k + γλ·A_k', r the token reward less its KL penalty
    (token_reward − token_kl, a null counting 0) and, after the last trainable token, V = final_value
    (0 when absent or null: no bootstrap). Tokens outside the loss are not transitions of the policy:
    the recursion crosses them, their values and rewards never enter it. An estimator that runs over
    every position (alibaba/ROLL#447: the critic's values under masked padding or tool output passed
    to the GAE recursion unmasked) bootstraps the last action before a masked span from the value of
    a token the policy never chose, and every earlier advantage of the episode carries that value.
    The finding names the last trainable token that differs (where the recursion first went wrong,
    reading backwards), what it bootstrapped from, and, when the recorded target is GAE over every
    position, the masked position and value it bootstrapped from. Targets are float32: each is
    compared within atol + rtol·|expected| + 2⁻¹⁶·S, S the discounted sum of the magnitudes it was
    computed from. Rows with a null value, reward or λ on a trainable token are not compared. Fix the
    estimator to skip the positions outside the loss (verl's compute_gae_advantage_return carries
    the next value and the running advantage across them), or mask the values before it reads them.
    """
    vals, tgt, rew = token_list(b, "token_values"), token_list(b, "token_value_targets"), token_list(b, "token_reward")
    kl = token_list(b, "token_kl") if b.has("token_kl") else None
    t = b.tokens
    lam, gamma, boot = (
        _row_floats(b, "gae_lambda", np.nan),
        _row_floats(b, "gamma", 1.0),
        _row_floats(b, "final_value", 0.0),
    )
    rows = vals.fits & tgt.fits & rew.fits & ~np.isnan(lam)
    if kl is not None:
        rows &= ~kl.broken
    idx = np.flatnonzero(t.mask & rows[t.row])
    if not idx.size:
        return _findings(vals.bad, tgt.bad, rew.bad, None if kl is None else kl.bad)
    row = t.row[idx]
    # a row with a trainable token missing its value or reward claims no recursion we can recompute
    gap = ~vals.present[idx] | ~rew.present[idx]
    if gap.any():
        keep = ~np.isin(row, row[gap])
        idx, row = idx[keep], row[keep]

    def terms(at: np.ndarray) -> np.ndarray:
        return native.terms(
            at,
            rew.values,
            None if rew.complete else rew.present,
            None if kl is None else kl.values,
            None if kl is None or kl.complete else kl.present,
        )

    def gae(at: np.ndarray, r: np.ndarray, slack: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
        """Over the elements `at` (whole rows, in order): (A + V, the value each element bootstrapped
        from, the float32 slack 2⁻¹⁶·S), S computed on the elements `slack` selects (0 elsewhere)."""
        rw = t.row[at]
        v = vals.values[at].astype(np.float64)
        end = np.r_[rw[1:] != rw[:-1], True] if at.size else np.zeros(0, bool)
        v_next = np.r_[v[1:], 0.0] if at.size else v
        v_next[end] = boot[rw[end]]
        g = gamma[rw]
        c = np.where(end, 0.0, g * lam[rw])
        out = np.zeros(at.size)
        with np.errstate(all="ignore"):
            target = discounted_to_go(r + g * v_next - v, c) + v
            if slack is None:
                slack = np.ones(at.size, bool)
            if slack.any():  # the magnitudes, on the rows that need them only (a second scan)
                on = np.isin(rw, rw[slack])
                mag = np.abs(r[on]) + np.abs(g[on] * v_next[on]) + np.abs(v[on])
                out[on] = F32_SLACK * (discounted_to_go(mag, c[on]) + np.abs(v[on]))
        return target, v_next, out

    def beyond_f32(found: np.ndarray, expected: np.ndarray, slack: np.ndarray | float) -> np.ndarray:
        with np.errstate(all="ignore"):
            return ~(np.abs(found - expected) <= tolerance(expected, cfg) + slack)

    r_idx = terms(idx)
    found = tgt.values[idx].astype(np.float64)
    expected, v_next, _ = gae(idx, r_idx, np.zeros(idx.size, bool))
    bad = beyond_f32(found, expected, 0.0) & tgt.present[idx]  # within atol + rtol: no slack needed
    if bad.any():
        expected, v_next, slack = gae(idx, r_idx, bad)
        bad &= beyond_f32(found, expected, slack)
    off = None
    if bad.any():
        # the last differing trainable token of each row
        at, rw = idx[bad], row[bad]
        last = np.r_[rw[1:] != rw[:-1], True]
        hit, where = at[last], np.flatnonzero(bad)[last]
        n_bad = np.bincount(rw, minlength=b.n)[rw[last]]
        nxt = np.where(where + 1 < idx.size, idx[np.minimum(where + 1, idx.size - 1)], -1)
        nxt = np.where((nxt >= 0) & (t.row[np.maximum(nxt, 0)] == t.row[hit]), nxt, -1)
        # GAE over every position of those rows: what an estimator that ignores the mask recorded
        every = np.flatnonzero(np.isin(t.row, t.row[hit]))
        naive, _, naive_slack = gae(every, terms(every))
        k = np.searchsorted(every, hit)
        matches = ~beyond_f32(found[where], naive[k], naive_slack[k])
        after = hit + 1
        inside = (after < t.row.size) & (t.row[np.minimum(after, t.row.size - 1)] == t.row[hit])
        after_c = np.minimum(after, t.row.size - 1)
        masked = inside & ~t.mask[after_c]
        names = {**S.SOURCE_NAMES}
        src = [names.get(int(s), "invalid source") for s in t.source[after_c]]
        base = t.starts[t.row[hit]]
        df = pl.DataFrame(
            {
                "trajectory_id": b.ids.gather(t.row[hit]),
                "position": (hit - base).astype(np.int64),
                "turn": pl.Series(t.turn[hit].astype(np.int64)).set(pl.Series(t.turn[hit] < 0), None),
                "_n": n_bad.astype(np.int64),
                "_found": found[where],
                "_exp": expected[where],
                "_g": gamma[t.row[hit]],
                "_l": lam[t.row[hit]],
                "_vn": v_next[where],
                "_next": np.where(nxt >= 0, nxt - base, -1).astype(np.int64),
                "_naive": matches & masked,
                "_mpos": (after - base).astype(np.int64),
                "_mv": vals.values[after_c].astype(np.float64),
                "_msrc": src,
            }
        )
        boot_from = (
            pl.when(pl.col("_next") >= 0)
            .then(pl.format("V = {} of the next trainable token, position {}", num(pl.col("_vn")), "_next"))
            .otherwise(pl.format("V = {} after the last trainable token", num(pl.col("_vn"))))
        )
        naive_msg = (
            pl.when(pl.col("_naive"))
            .then(
                pl.format(
                    "; it is GAE over every position, which bootstraps from V = {} at position {}, a masked {} token",
                    num(pl.col("_mv")),
                    "_mpos",
                    "_msrc",
                )
            )
            .otherwise(pl.lit(""))
        )
        if "token_turn" not in b.lists:
            df = df.with_columns(pl.lit(None, pl.Int64).alias("turn"))
        off = df.select(
            "trajectory_id",
            "turn",
            "position",
            pl.format(
                "token_value_targets differ from GAE over the trainable tokens (γ {}, λ {}) on {} token(s); "
                "the last is {}, expected {} (it bootstraps from {}){}",
                num(pl.col("_g")),
                num(pl.col("_l")),
                "_n",
                num(pl.col("_found")),
                num(pl.col("_exp")),
                boot_from,
                naive_msg,
            ).alias("message"),
        )
    return _findings(vals.bad, tgt.bad, rew.bad, None if kl is None else kl.bad, off)


# ------------------------------------------------------------------ R417: step rewards overwritten


@rule(
    "R417",
    "step rewards replaced by the terminal reward",
    "error",
    requires=("turns.reward", "turns.raw_reward"),
    optional=("gamma",),
    config=("atol", "rtol"),
    preview=True,
)
def lost_step_rewards(b: BatchView, cfg) -> pl.DataFrame | None:
    """Every turn of an episode trains the same reward, its last turn's, while the rewards the
    environment paid per turn (turns.raw_reward) carry step rewards the trained ones lost.

    Lesson “Process feedback and hindsight critics”: a step reward credits the turn that earned it;
    a pipeline that writes the episode's (normalised) outcome on every turn in its place trains each
    turn on the outcome alone (areal-project/AReaL#1674: AReaL's group normalisation,
    areal/infra/remote_inf_engine.py:194-205 at cbff54d6, writes the normalised reward of each rollout's
    last interaction on every interaction, the paid one kept as original_reward). A raw reward of an earlier turn is
    a step reward when it is neither 0 nor the raw terminal reward discounted back to it
    (γ^(T−1−t)·raw_{T−1}: an outcome a workflow propagated backwards is no step reward, and
    broadcasting its normalised value is what such a workflow means). Reported at the first turn whose
    step reward differs from the reward trained there, for episodes of two or more turns whose every
    trained reward equals the last within atol + rtol·|last|; turns with a null reward or raw reward
    are not compared. Fix the normalisation to replace only the terminal reward (the "terminal" mode
    AReaL#1674 proposes), or normalise the step rewards themselves.
    """
    tr = b.turns
    if tr.is_empty():
        return None
    df = _turns(b, "reward", "raw_reward")

    def last(c: str) -> pl.Expr:  # turns are in order per trajectory
        return pl.col(c).last().over("_row")

    k = pl.col("_T") - 1 - pl.col("_t")
    step = _off(pl.col("raw_reward"), pl.lit(0.0), cfg) & _off(
        pl.col("raw_reward"), _G.pow(k) * last("raw_reward"), cfg
    )
    df = df.with_columns(
        _off(pl.col("reward"), last("reward"), cfg).any().over("_row").alias("_varies"),
        (pl.col("reward").is_null() | pl.col("raw_reward").is_null()).any().over("_row").alias("_nulls"),
        (step & (pl.col("_t") < pl.col("_T") - 1) & _off(pl.col("reward"), pl.col("raw_reward"), cfg)).alias("_lost"),
        last("reward").alias("_r_last"),
        last("raw_reward").alias("_raw_last"),
    )
    hit = df.filter((pl.col("_T") >= 2) & ~pl.col("_varies") & ~pl.col("_nulls") & pl.col("_lost"))
    if hit.is_empty():
        return None
    first = hit.group_by("_row", maintain_order=True).agg(pl.all().first(), pl.len().alias("_n"))
    return first.select(
        "trajectory_id",
        pl.col("_t").alias("turn"),
        pl.format(
            "every one of the {} turns trains reward {}, the last turn's; {} turn(s) lose a step reward, the "
            "first this one: raw reward {} (not 0, nor the raw terminal reward {} discounted back to it)",
            "_T",
            num(pl.col("_r_last")),
            "_n",
            num(pl.col("raw_reward")),
            num(pl.col("_raw_last")),
        ).alias("message"),
    )
