"""The code blocks of docs/frameworks/{verl,skyrl,slime}.md that name what an integration is switched on
by or writes, rendered from the integrations' own constants (`python -m rollout_audit.dev generate`):
the "Set these options" lines (verl's overrides from `verl_v1.options`, slime's flags from
`integrations.slime.OPTIONS`) and the key lists of the fallback pastes (the same keys the integration
writes: `SAMPLE_KEYS`, `TRAIN_KEYS`, `TRAIN_ARGS`, `BATCH_KEYS`). A key the code gains or loses
reaches the page, so a paste cannot leave out a field the adapter reads (tests/test_framework_snippets.py
checks the code's keys against what the adapters read)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

# the check command of the verl and slime pages' first block (the identity values are examples)
IDENTITY = (
    "--context environment_id=search-qa \\\n"
    "    --context environment_version=2026-08 --context verifier_version=em-v1 --context reset_seed=0 \\\n"
    "    --context temperature=1.0 --context top_p=1.0"
)
VERL_DIR = "rollout_dumps/verl"
# the page's one-liner that prints the YAML's path wherever rollout-audit is installed
VERL_CONFIG = '$(python -c "import rollout_audit.integrations.verl_loop as m; print(m.CONFIG)")'
VERL_CONFIG_KEY = "actor_rollout_ref.rollout.agent.agent_loop_config_path"


def _fenced(body: str, lang: str = "") -> str:
    return f"\n```{lang}\n{body.rstrip()}\n```\n\n"


def _strings(name: str, items: Iterable[str]) -> str:
    """A Python tuple of strings, one per line (as ruff formats it)."""
    return f"{name} = (\n" + "".join(f'    "{k}",\n' for k in items) + ")"


# ---------------------------------------------------------------- verl


def verl_options() -> str:
    from ..integrations.verl_v1 import options

    given = {k: (VERL_CONFIG if k == VERL_CONFIG_KEY else v) for k, v in options(VERL_DIR).items()}
    lines = ['pip install "rollout-audit[verl]"', "python -m verl.trainer.main_ppo ... \\"]
    lines += [f"    {k}={v} \\" for k, v in given.items()]
    lines[-1] = lines[-1].removesuffix(" \\")
    check = f"rollout-audit check --from verl {VERL_DIR} {IDENTITY} --context top_k=-1 --context response_length=64"
    return _fenced("\n".join(lines) + "\n" + check)


def verl_yaml() -> str:
    from ..integrations.verl_v1 import options

    tree: dict = {}
    for key, value in options(VERL_DIR).items():
        *parents, leaf = key.lstrip("+").split(".")
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = "/path/to/rollout_audit/integrations/verl_agent_loops.yaml" if key == VERL_CONFIG_KEY else value

    def lines(node: dict, depth: int) -> list[str]:
        out = []
        for k, v in node.items():
            if isinstance(v, dict):
                out += [f"{'  ' * depth}{k}:", *lines(v, depth + 1)]
            else:
                out.append(f"{'  ' * depth}{k}: {v.lower() if v in ('True', 'False') else v}")
        return out

    return _fenced("\n".join(lines(tree, 0)), "yaml")


# ---------------------------------------------------------------- slime


def slime_options() -> str:
    from ..integrations import slime

    lines = [
        'pip install "rollout-audit[slime]"',
        f"{slime.ENV_DIR}=rollout_dumps python train.py <your slime arguments> \\",
    ]
    lines += [f"    {flag} rollout_audit.integrations.slime.{fn} \\" for flag, fn in slime.OPTIONS.items()]
    lines[-1] = lines[-1].removesuffix(" \\")
    return _fenced("\n".join(lines))


def slime_sample_dump() -> str:
    from ..integrations.slime import SAMPLE_KEYS

    return _fenced(
        "import json\n\n"
        + _strings("keys", SAMPLE_KEYS)
        + '\nwith open(f"rollout_dumps/slime-{self.rollout_id}.jsonl", "a") as fh:  # the directory must exist\n'
        "    for s in samples:\n"
        "        d = s.to_dict()\n"
        '        rec = {k: d[k].tolist() if hasattr(d[k], "tolist") else d[k] for k in keys}  # the routes are a tensor\n'
        '        fh.write(json.dumps(rec, default=str) + "\\n")',
        "python",
    )


def slime_train_dump() -> str:
    from ..integrations.slime import TRAIN_ARGS, TRAIN_KEYS

    return _fenced(
        _strings("keys", TRAIN_KEYS)
        + "\n"
        + _strings("names", TRAIN_ARGS)
        + '\nwith open(f"rollout_dumps/slime-{self.rollout_id}.jsonl", "a") as fh:\n'
        "    fh.write(\n"
        "        json.dumps(\n"
        "            {\n"
        '                "rollout_id": self.rollout_id,\n'
        "                **{k: train_data[k] for k in keys},\n"
        '                "args": {k: getattr(self.args, k) for k in names},\n'
        "            }\n"
        "        )\n"
        '        + "\\n"\n'
        "    )",
        "python",
    )


# ---------------------------------------------------------------- SkyRL

# what the sampler pastes write besides the GeneratorOutput lists the entry point writes: the agent
# loop paste's engine calls, and the routes (0.4.0's entry point does not dump them, see NOT_DUMPED)
SKYRL_PASTE_KEYS = ("engine_calls", "rollout_expert_indices")


def _skyrl_keys() -> str:
    from ..integrations.skyrl import SAMPLE_KEYS

    return _strings("keys", (*SAMPLE_KEYS, *SKYRL_PASTE_KEYS))


def skyrl_sample_dump() -> str:
    return _fenced(
        "import dataclasses, json\n\n"
        + _skyrl_keys()
        + '\nstep = input_batch["batch_metadata"].global_step if input_batch.get("batch_metadata") else None\n'
        'tids = generator_output.get("trajectory_ids") or input_batch["trajectory_ids"]\n'
        'with open(f"rollout_dumps/skyrl-{step}.jsonl", "a") as fh:  # the directory must exist\n'
        "    for i, tid in enumerate(tids):\n"
        "        rec = {k: generator_output[k][i] for k in keys if generator_output.get(k) is not None}\n"
        '        rec = {k: v.tolist() if hasattr(v, "tolist") else v for k, v in rec.items()}  # routes are NumPy arrays\n'
        "        rec.update(trajectory_ids=dataclasses.asdict(tid), global_step=step)\n"
        '        fh.write(json.dumps(rec) + "\\n")',
        "python",
    )


def skyrl_async_dump() -> str:
    return _fenced(
        "import dataclasses, json\n\n" + _skyrl_keys() + "\nout = cur_generator_output\n"
        'tids = out.get("trajectory_ids") or generator_input["trajectory_ids"]\n'
        'with open(f"rollout_dumps/skyrl-async-{global_step_at_start}.jsonl", "a") as fh:\n'
        "    for i, tid in enumerate(tids):\n"
        "        rec = {k: out[k][i] for k in keys if out.get(k) is not None}\n"
        '        rec = {k: v.tolist() if hasattr(v, "tolist") else v for k, v in rec.items()}\n'
        "        rec.update(trajectory_ids=dataclasses.asdict(tid), global_step_when_scheduled=global_step_at_start)\n"
        '        fh.write(json.dumps(rec) + "\\n")',
        "python",
    )


def skyrl_trainer_dump() -> str:
    from ..integrations.skyrl import BATCH_KEYS

    tensors = "".join(f'                    "{k}": training_input["{k}"][i, :n].tolist(),\n' for k in BATCH_KEYS)
    return _fenced(
        "import dataclasses, json\n\n"
        "alg = self.cfg.trainer.algorithm\n"
        'tids = generator_output.get("trajectory_ids") or generator_input["trajectory_ids"]\n'
        'last = training_input.metadata.get("is_last_step")\n'
        'with open(f"rollout_dumps/skyrl-{self.global_step}.jsonl", "a") as fh:\n'
        "    for i, tid in enumerate(tids):\n"
        '        n = len(generator_output["response_ids"][i])\n'
        "        fh.write(\n"
        "            json.dumps(\n"
        "                {\n"
        '                    "global_step": self.global_step,\n'
        '                    "trajectory_ids": dataclasses.asdict(tid),\n'
        '                    "is_last_step": None if last is None else bool(last[i]),\n'
        + tensors
        + '                    "advantage_estimator": str(alg.advantage_estimator),\n'
        '                    "grpo_norm_by_std": alg.grpo_norm_by_std,\n'
        "                }\n"
        "            )\n"
        '            + "\\n"\n'
        "        )",
        "python",
    )


def regions() -> dict[str, dict[str, Callable[[], str]]]:
    """The generated regions of each framework page, by page file name."""
    return {
        "verl.md": {"verl-options": verl_options, "verl-yaml": verl_yaml},
        "slime.md": {
            "slime-options": slime_options,
            "slime-sample-dump": slime_sample_dump,
            "slime-train-dump": slime_train_dump,
        },
        "skyrl.md": {
            "skyrl-sample-dump": skyrl_sample_dump,
            "skyrl-async-dump": skyrl_async_dump,
            "skyrl-trainer-dump": skyrl_trainer_dump,
        },
    }
