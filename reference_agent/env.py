"""Key-and-door environment (lesson 11.5.4): a partially observable tool task with a hidden colour."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

ENVIRONMENT_ID = "keydoor"
ENVIRONMENT_VERSION = "keydoor-1.0"
VERIFIER_VERSION = "keydoor-verifier-1.0"

ACTIONS: tuple[str, ...] = ("inspect", "pickup_red", "pickup_blue", "open_red", "open_blue", "finish")
COLOURS: tuple[str, ...] = ("red", "blue")
BUDGET_RANGE: tuple[int, int] = (3, 5)  # inclusive range of non-finish actions a task allows
STUCK_PROB = 0.2  # chance the target door sticks once (one retry needed): makes budgets and turn limits bind

# Every text the environment can emit; the tokenizer's vocabulary is built to cover exactly these.
OBS_RESET = "you are in a room with a red key , a blue key , a red door and a blue door ."
OBS_CLUE = "the clue is {colour} ."
OBS_NOTE_GONE = "the note is gone ."  # the clue is shown once: re-reading it would let a memoryless policy cheat
OBS_TAKE = "you take the key ."  # the key colour is deliberately not repeated: the policy must remember it
OBS_ALREADY_CARRY = "you already carry a key ."
OBS_NO_KEY = "you have no key ."
OBS_JAMMED = "the key jams the lock ."  # wrong key in a door: a genuine, terminal task failure
OBS_ALREADY_OPEN = "a door is already open ."
OBS_OPENS = "the door opens ."
OBS_STUCK = "the door is stuck ."
OBS_TIME_UP = "the time is up ."
ALL_OBSERVATIONS: tuple[str, ...] = (
    OBS_RESET,
    OBS_CLUE.format(colour="red"),
    OBS_CLUE.format(colour="blue"),
    OBS_NOTE_GONE,
    OBS_TAKE,
    OBS_ALREADY_CARRY,
    OBS_NO_KEY,
    OBS_JAMMED,
    OBS_ALREADY_OPEN,
    OBS_OPENS,
    OBS_STUCK,
    OBS_TIME_UP,
)


@dataclass
class KeyDoorState:
    """The true (hidden) world state; Φ and the verifier read it, the policy never does."""

    target: str
    inspected: bool
    key: str | None
    opened: str | None
    budget: int
    stuck: bool = False
    done: bool = False


def task_from_seed(seed: int) -> tuple[str, int, bool]:
    """Derive the task from the reset seed so a seed names one task: parity → colour, hash → budget, stuck."""
    rng = np.random.default_rng([seed, 7])
    target = COLOURS[seed % 2]
    budget = int(rng.integers(BUDGET_RANGE[0], BUDGET_RANGE[1] + 1))
    return target, budget, bool(rng.random() < STUCK_PROB)


def state_checksum(state: KeyDoorState) -> str:
    """SHA-256 of the canonical JSON of the world state: same seed → same checksum (E802)."""
    blob = json.dumps(asdict(state), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def potential(state: KeyDoorState) -> float:
    """Φ over the TRUE state (progress towards the target door), zero at terminal states (R405)."""
    if state.done:
        return 0.0
    return 0.25 * state.inspected + 0.25 * (state.key == state.target) + 0.5 * (state.opened == state.target)


def verify(state: KeyDoorState) -> bool:
    """The verifier checks the world, not the text: was the target door opened."""
    return state.opened is not None and state.opened == state.target


class KeyDoorEnv:
    """Gymnasium-style env: reset(seed) → (obs, info); step(action) → (obs, reward, terminated, truncated, info).

    The task budget is part of the task (terminal failure, stop_reason task_budget); the collector's
    turn limit is not the env's business (truncated is always False here). With infra_failure_rate > 0
    a step may time out (info["tool_status"] == "timeout"), leaving the state unchanged.
    """

    def __init__(self, infra_failure_rate: float = 0.0) -> None:
        self.infra_failure_rate = infra_failure_rate
        self.state: KeyDoorState | None = None
        self._fault_rng = np.random.default_rng(0)

    def reset(self, seed: int, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start the task named by seed (options may force "target"/"budget"/"stuck"; "fault_seed" seeds faults)."""
        options = options or {}
        target, budget, stuck = task_from_seed(seed)
        target = options.get("target", target)
        budget = int(options.get("budget", budget))
        stuck = bool(options.get("stuck", stuck))
        self.state = KeyDoorState(target=target, inspected=False, key=None, opened=None, budget=budget, stuck=stuck)
        self._fault_rng = np.random.default_rng([seed, int(options.get("fault_seed", 0)), 11])
        info = {
            "checksum": state_checksum(self.state),
            "target": target,
            "budget": budget,
            "potential": potential(self.state),
        }
        return OBS_RESET, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply one macro-action; the sparse outcome reward (1 iff target door open) is paid at finish."""
        s = self.state
        assert s is not None and not s.done, "step() on a finished episode: call reset()"
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}")
        if self.infra_failure_rate > 0 and self._fault_rng.random() < self.infra_failure_rate:
            return "", 0.0, False, False, self._info("timeout", None)
        if action == "finish":
            s.done = True
            reward = 1.0 if verify(s) else 0.0
            return "", reward, True, False, self._info("ok", "success" if reward > 0 else "failure")
        if s.budget <= 0:  # the action is refused: the task's own budget is exhausted
            s.done = True
            return OBS_TIME_UP, 0.0, True, False, self._info("ok", "task_budget")
        s.budget -= 1
        if action == "inspect":
            obs = OBS_NOTE_GONE if s.inspected else OBS_CLUE.format(colour=s.target)
            s.inspected = True
        elif action.startswith("pickup_"):
            if s.key is not None:
                obs = OBS_ALREADY_CARRY
            else:
                s.key = action.split("_")[1]
                obs = OBS_TAKE
        else:  # open_*
            colour = action.split("_")[1]
            if s.opened is not None:
                obs = OBS_ALREADY_OPEN
            elif s.key is None:
                obs = OBS_NO_KEY
            elif s.key != colour:  # no second try: otherwise a memoryless policy could test both doors
                s.done = True
                return OBS_JAMMED, 0.0, True, False, self._info("ok", "failure")
            elif s.stuck:  # the door gives way on the next try
                s.stuck = False
                obs = OBS_STUCK
            else:
                s.opened = colour
                obs = OBS_OPENS
        return obs, 0.0, False, False, self._info("ok", None)

    def _info(self, tool_status: str, stop_reason: str | None) -> dict[str, Any]:
        """Step info: tool status, stop reason, the new state's potential and checksum, verifier verdict."""
        assert self.state is not None
        return {
            "tool_status": tool_status,
            "stop_reason": stop_reason,
            "potential": potential(self.state),
            "checksum": state_checksum(self.state),
            "verifier_success": verify(self.state),
        }


def controller_mask(observations: list[str]) -> np.ndarray:
    """Legal-action mask from the visible transcript only (never the hidden colour).

    Before a key is taken, open_* is hidden; once the note was read, inspect is hidden (it is gone);
    after a door opened only finish remains.
    """
    has_key = OBS_TAKE in observations
    door_open = OBS_OPENS in observations
    clue_read = any(o.startswith("the clue is") for o in observations)
    mask = np.ones(len(ACTIONS), dtype=bool)
    mask[ACTIONS.index("inspect")] = not clue_read
    if door_open:
        mask[:] = False
        mask[ACTIONS.index("finish")] = True
    elif not has_key:
        mask[ACTIONS.index("open_red")] = False
        mask[ACTIONS.index("open_blue")] = False
    else:
        mask[ACTIONS.index("pickup_red")] = False
        mask[ACTIONS.index("pickup_blue")] = False
    return mask
