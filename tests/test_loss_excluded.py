"""Episodes excluded from the loss but counted in their group's statistics (contract 1.2
`loss_excluded`, TRL's mask_truncated_completions): accepted by T304, M102 and U606, checked by
M109; and U601's acceptance of a count clamped to 1 on a window without a trainable token."""

from __future__ import annotations

from checkhelp import audit, loud, rows

U_AND_T = {"T304", "M102", "U606", "M109", "U601", "U602"}


def _masked_truncation(trajs, ups) -> dict:
    """A collector-truncated episode, scored, with no token in the loss (as TRL's
    mask_truncated_completions leaves it), named by an update of its own."""
    t = next(t for t in trajs if t["truncated"])
    t["reward"] = 0.0
    t["loss_mask"] = [False] * len(t["loss_mask"])
    t["num_trainable_tokens"] = 0
    version = max(tr["policy_version"] for tr in t["turns"])
    ups.append(
        {
            "update_step": 9,
            "trainer_version": version,
            "trajectory_ids": [t["trajectory_id"]],
            "reduction": "trajectory",
            "loss_denominator": 1.0,
            "max_policy_lag": 0,
        }
    )
    return t


def test_a_truncated_episode_kept_for_the_group_only_is_not_t304_m102_u606(records):
    trajs, ups = records
    t = _masked_truncation(trajs, ups)
    # undeclared, it reads as a truncated episode rewarded and trained against `exclude`
    assert {"T304", "M102", "U606"} <= loud(audit(trajs, ups))
    t["loss_excluded"] = True
    rep = audit(trajs, ups)
    assert not (loud(rep) & U_AND_T), rep.render()


def test_m109_a_declared_exclusion_whose_tokens_are_trained(records):
    trajs, ups = records
    t = _masked_truncation(trajs, ups)
    t["loss_excluded"] = True
    first = next(i for i, s in enumerate(t["token_source"]) if s == 2)
    t["loss_mask"][first] = True
    t["num_trainable_tokens"] = 1
    f = rows(audit(trajs, ups, select=["M109"]), "M109")
    assert f["trajectory_id"].to_list() == [t["trajectory_id"]] and f["position"].to_list() == [first]
    assert "loss_excluded is true, but loss_mask is true on 1 token(s)" in f["message"][0]
    assert f["severity"].to_list() == ["error"]


def test_m109_silent_and_m102_unchanged_without_the_column(records):
    trajs, ups = records
    rep = audit(trajs, ups)
    assert "M109" in rep.summary["checks_run"] and not rows(rep, "M109").height


def _empty_window_update(denominator: float, scale: float | None, reduction: str = "token_window") -> dict:
    rec = {
        "update_step": 9,
        "trainer_version": 9,
        "trajectory_ids": [],
        "reduction": reduction,
        "loss_denominator": denominator,
        "advantages": [],
        "window_tokens": 0.0,
    }
    return rec | ({"denominator_scale": scale} if scale is not None else {})


def test_u601_accepts_the_clamp_of_an_empty_window_to_one_and_nothing_else(records):
    trajs, ups = records
    for rec in (
        _empty_window_update(1.0, None),  # TRL: num_items_in_batch.clamp(min=1.0)
        _empty_window_update(0.25, 0.25),  # the clamped count times the declared scale
        _empty_window_update(1.0, None, "token"),
    ):
        assert not (loud(audit(trajs, [*ups, rec])) & {"U601"}), rec
    for rec in (_empty_window_update(2.0, None), _empty_window_update(1.0, 0.25)):
        f = rows(audit(trajs, [*ups, rec]), "U601")
        assert f.height == 1 and "expected 0" in f["message"][0], rec
