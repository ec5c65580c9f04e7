"""verl's V1 trainer records its advantage step by configuration (no source edit): `setup` (Ray's
`worker_process_setup_hook`) registers the audited subclass of each V1 mode in verl 0.9.1's own
`TRAINER_REGISTRY`, `get_trainer_cls` returns it, and verl's own `PPOTrainer._compute_advantage`
(GRPO through `compute_advantage_for_multi_trajectories`) runs inside it. TransferQueue cannot start
here (its `init` needs a Ray cluster's controller and storage actors), so the step's fields live in
`Store`, which keeps and returns them in the layout verl's code puts and reads: one nested (jagged)
tensor row per key. verl's own `_write_generations` writes the `{step}.jsonl` beside the records."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")

from adapterhelp import cli, context_args, findings
from frameworks.build import ROOT

PAGE = [*context_args(), "--context", "top_k=-1", "--context", "response_length=64"]
FIXTURE = ROOT / "verl" / "compliant_v1.jsonl"
STEP = 5


class Store:
    """TransferQueue's key-value face (`kv_batch_put`, `kv_batch_get`) over a dict: per key, the
    fields put, each a tensor row (per token) or a plain value (`uid`)."""

    def __init__(self):
        self.rows: dict[str, dict] = {}

    def kv_batch_put(self, keys, partition_id, fields, tags=None):
        from transfer_queue import KVBatchMeta

        for name in fields.keys():
            value = fields[name]
            rows = value.unbind() if getattr(value, "is_nested", False) else list(value)
            for key, row in zip(keys, rows):
                self.rows.setdefault(key, {})[name] = row
        return KVBatchMeta(keys=list(keys), partition_id=partition_id, tags=[{} for _ in keys])

    def kv_batch_get(self, keys, partition_id, select_fields):
        import torch
        from tensordict import NonTensorStack, TensorDict

        out = {}
        for name in select_fields:
            if not all(name in self.rows[k] for k in keys):
                continue  # a field the step never put (no critic, no reference)
            rows = [self.rows[k][name] for k in keys]
            if isinstance(rows[0], torch.Tensor):
                out[name] = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
            else:
                out[name] = NonTensorStack(*rows)
        return TensorDict(out, batch_size=len(keys))


def _loop_records():
    from rollout_audit.adapters.base import read_dump
    from rollout_audit.adapters.verl import _kind

    return [dict(r) for r in read_dump(FIXTURE) if _kind(r) == "sampler"]


def _put_agent_loop_outputs(store: Store, samples: list[dict]) -> list[str]:
    """What the V1 agent loop puts per key (v1/agent_loop_tq.py:182-227) and the step adds before the
    advantage step: the score on the last response token (rm_scores), the actor's old log-probs."""
    import torch

    keys = [s["request_id"] for s in samples]
    for s in samples:
        n = len(s["response_ids"])
        score = torch.zeros(n)
        score[-1] = float(s["request_id"].split("_")[1])  # the fixture's reward: the session's index
        store.rows[s["request_id"]] = {
            "uid": s["uid"],
            "responses": torch.tensor(s["response_ids"]),
            "response_mask": torch.tensor(s["response_mask"], dtype=torch.float32),
            "rm_scores": score,
            "rollout_log_probs": torch.tensor(s["response_logprobs"]),
            "old_log_probs": torch.where(
                torch.tensor(s["response_mask"]).bool(), torch.tensor(s["response_logprobs"]), torch.tensor(-5.0)
            ),
        }
    return keys


def _trainer(tmp_path, monkeypatch, store: Store, mode: str = "sync"):
    """The audited trainer as TaskRunnerV1.run builds it: its class from verl's registry by the
    configured name, its config the run's (trainer.rollout_data_dir, config.algorithm)."""
    import transfer_queue
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1 import get_trainer_cls

    from rollout_audit.integrations.verl_v1 import PREFIX, setup

    monkeypatch.setattr(transfer_queue, "kv_batch_get", store.kv_batch_get)
    monkeypatch.setattr(transfer_queue, "kv_batch_put", store.kv_batch_put)
    setup()
    cls = get_trainer_cls(PREFIX + mode)
    config = OmegaConf.create(
        {
            "trainer": {"rollout_data_dir": str(tmp_path), "v1": {"trainer_mode": PREFIX + mode}},
            "algorithm": {
                "adv_estimator": "grpo",
                "norm_adv_by_std_in_grpo": True,
                "gamma": 1.0,
                "lam": 1.0,
                "use_kl_in_reward": False,
            },
            "actor_rollout_ref": {"rollout": {"n": 2}},
        }
    )
    trainer = cls.__new__(cls)  # verl's constructor starts the replay buffer's workers; set what the step reads
    trainer.audit_dir = tmp_path / "rollout-audit"
    trainer.config, trainer.global_steps, trainer.local_trigger_step, trainer.parameter_sync_step = config, STEP, 0, 1
    return trainer, config


def test_setup_registers_an_audited_subclass_of_every_v1_mode_under_its_prefixed_name():
    from verl.trainer.ppo.v1 import get_trainer_cls, trainer_base

    from rollout_audit.integrations.verl_v1 import PREFIX, setup

    setup()
    setup()  # every Ray worker runs it; a second run registers nothing twice
    for mode in ("sync", "colocate_async", "separate_async"):
        audited = get_trainer_cls(PREFIX + mode)
        assert issubclass(audited, get_trainer_cls(mode)) and audited is not get_trainer_cls(mode)
    assert not any(k.startswith(PREFIX + PREFIX) for k in trainer_base.TRAINER_REGISTRY)
    import pickle

    assert pickle.loads(pickle.dumps(get_trainer_cls(PREFIX + "sync"))) is get_trainer_cls(PREFIX + "sync")


def test_a_verl_outside_the_tested_range_is_one_warning():
    import verl

    from rollout_audit.integrations.verl_v1 import version_warning

    assert version_warning(verl.__version__) is None  # the installed verl is the tested one
    assert "verl 0.10.0 is outside the tested range (0.9.1)" in version_warning("0.10.0")


def test_the_constructor_gives_verl_the_mode_name_and_needs_a_directory(tmp_path):
    """verl's own constructor picks the replay buffer by trainer_mode (trainer_base.py:153): the audited
    class hands it the mode's name; without trainer.rollout_data_dir it fails before verl starts."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1 import get_trainer_cls

    from rollout_audit.integrations.verl_v1 import PREFIX, setup

    setup()
    cls = get_trainer_cls(PREFIX + "sync")
    with pytest.raises(ValueError, match="rollout_data_dir"):
        cls(OmegaConf.create({"trainer": {"rollout_data_dir": None, "v1": {"trainer_mode": PREFIX + "sync"}}}))
    config = OmegaConf.create({"trainer": {"rollout_data_dir": str(tmp_path), "v1": {"trainer_mode": PREFIX + "sync"}}})
    with pytest.raises(Exception):  # noqa: B017 - verl's constructor stops on the rest of a real config
        cls(config)
    assert config.trainer.v1.trainer_mode == "sync"


def test_verl_v1_advantage_step_through_the_audited_trainer_audits_clean(tmp_path, monkeypatch):
    """verl's own V1 `_compute_advantage` on the step's keys, recorded by the audited trainer, with the
    wrapper's records and verl's own `{step}.jsonl` beside: `check --from verl` on trainer.rollout_data_dir
    joins the three, is clean, and runs U603 (recomputed GRPO), U607, U608 and L207."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    store = Store()
    samples = _loop_records()
    keys = _put_agent_loop_outputs(store, samples)
    trainer, _ = _trainer(tmp_path, monkeypatch, store)
    from transfer_queue import KVBatchMeta

    meta = trainer._compute_advantage(KVBatchMeta(keys=keys, partition_id="train", tags=[{}] * len(keys)), {})
    assert meta.keys == keys  # what verl returned, forwarded
    loop = tmp_path / "rollout-audit" / "verl-loop.jsonl"
    loop.write_text("".join(json.dumps(s) + "\n" for s in samples))
    scores = [float(store.rows[k]["rm_scores"].sum()) for k in keys]
    PPOTrainer._write_generations(
        ["p"] * len(keys), ["r"] * len(keys), [None] * len(keys), scores, {"uid": keys}, str(tmp_path), STEP
    )

    result = cli("check", "--from", "verl", tmp_path, *PAGE, "--format", "json")
    rep = json.loads(result.stdout)
    assert result.exit_code == 0 and rep["findings"] == [], result.output
    not_run = {n["code"]: n["reason"] for n in rep["not_run"]}
    assert not {"U603", "U607", "U608", "L207"} & set(not_run)
    assert not_run["R414"].startswith("rollout-audit's verl V1 trainer: verl scores after the agent loop")


def test_advantages_written_under_other_keys_are_u603(tmp_path, monkeypatch):
    """verl#7956's effect on a recorded V1 step: the advantages TransferQueue holds under two keys are
    each other's (the resample of compute_pf_ppo_reweight_data written back under the original keys):
    U603 names both, from the audited trainer's record alone (no generations file)."""
    import torch
    from transfer_queue import KVBatchMeta

    store = Store()
    samples = _loop_records()
    keys = _put_agent_loop_outputs(store, samples)
    trainer, _ = _trainer(tmp_path, monkeypatch, store)
    put = store.kv_batch_put

    def mispaired(keys, partition_id, fields, tags=None):
        a = fields["advantages"].unbind()
        swapped = [a[1], a[0], *a[2:]]  # the two 7c1f rows, of equal length, exchanged
        fields["advantages"] = torch.nested.as_nested_tensor(swapped, layout=torch.jagged)
        return put(keys, partition_id, fields, tags)

    store.kv_batch_put = mispaired
    monkeypatch.setattr("transfer_queue.kv_batch_put", mispaired)
    trainer._compute_advantage(KVBatchMeta(keys=keys, partition_id="train", tags=[{}] * len(keys)), {})
    (tmp_path / "rollout-audit" / "verl-loop.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    result = cli("check", "--from", "verl", tmp_path, *PAGE, "--format", "json")
    hits = {(f[0], f[1]) for f in findings(result)}
    assert {("U603", keys[0]), ("U603", keys[1])} <= hits, result.output
    assert result.exit_code == 1


def test_a_step_the_trainer_could_not_read_back_is_exit_2_naming_it(tmp_path, monkeypatch):
    """TransferQueue failing under the recorder: training goes on (verl's result is returned), the
    dump says which step is missing and why, and `check` stops with that one line."""
    from transfer_queue import KVBatchMeta

    store = Store()
    samples = _loop_records()
    keys = _put_agent_loop_outputs(store, samples)
    trainer, _ = _trainer(tmp_path, monkeypatch, store)

    def broken(keys, partition_id, select_fields):
        raise RuntimeError("controller gone")

    meta = KVBatchMeta(keys=keys, partition_id="train", tags=[{}] * len(keys))
    monkeypatch.setattr("transfer_queue.kv_batch_get", broken)
    with pytest.raises(RuntimeError):  # verl's own read fails first: nothing of ours in the way
        trainer._compute_advantage(meta, {})
    monkeypatch.setattr("transfer_queue.kv_batch_get", store.kv_batch_get)
    calls = {"n": 0}

    def second_fails(keys, partition_id, select_fields):
        calls["n"] += 1
        if calls["n"] > 1:
            raise RuntimeError("controller gone")
        return store.kv_batch_get(keys, partition_id, select_fields)

    monkeypatch.setattr("transfer_queue.kv_batch_get", second_fails)
    assert trainer._compute_advantage(meta, {}).keys == keys
    (tmp_path / "rollout-audit" / "verl-loop.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    result = cli("check", "--from", "verl", tmp_path, *PAGE)
    assert result.exit_code == 2
    assert "the verl V1 trainer recorded no update for global_steps 5" in result.output
    assert "controller gone" in result.output and "Traceback" not in result.output


def _page_blocks():
    """The code blocks of verl.md's "Set these options" section: the command lines, the YAML."""
    import re

    page = (ROOT.parents[1] / "docs" / "frameworks" / "verl.md").read_text()
    section = page.split("## Set these options", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```[^\n]*\n(.*?)^```", section, flags=re.M | re.S)


def test_the_pages_option_lines_are_the_integrations_and_verls():
    """Every `key=value` of the page's `main_ppo` command and every leaf of its YAML is one of
    `verl_v1.options` (the config path as the page's `python -c` prints it), and each key is verl's:
    present in verl 0.9.1's composed config, or, for a `+key`, absent there under a parent that is."""
    import contextlib
    import io
    import re
    import shlex
    from pathlib import Path

    import verl
    from omegaconf import OmegaConf

    from rollout_audit.integrations.verl_v1 import options

    command, yaml = _page_blocks()[:2]
    flat = command.replace("\\\n", " ")
    line = next(ln for ln in flat.splitlines() if "verl.trainer.main_ppo" in ln)
    snippet = re.search(r'\$\(python -c "([^"]+)"\)', line)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(snippet.group(1), {})  # the page's own one-liner
    line = line.replace(snippet.group(0), printed.getvalue().strip())
    given = dict(a.split("=", 1) for a in shlex.split(line) if "=" in a)
    want = options("rollout_dumps/verl")
    assert given == want

    def leaves(node, prefix=""):
        for k, v in node.items():
            yield from leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)]

    in_yaml = dict(leaves(OmegaConf.to_container(OmegaConf.create(yaml))))
    assert set(in_yaml) == {k.lstrip("+") for k in want}
    assert all(str(in_yaml[k.lstrip("+")]).lower() == v.lower() for k, v in want.items() if "config_path" not in k)

    composed = OmegaConf.load(Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml")
    for key in want:
        parent, _, leaf = key.lstrip("+").rpartition(".")
        node = OmegaConf.select(composed, parent)
        assert node is not None, f"verl's config has no {parent}"
        assert (leaf in node) != key.startswith("+"), f"{key}: Hydra's `+` iff the key is new to verl's config"


def test_drift_verl_v1_names_the_trainer_record_relies_on():
    """What the audited trainer imports, overrides and reads in verl 0.9.1: the registry and its
    decorator, the lookup by `trainer.v1.trainer_mode`, the method it wraps and the fields verl's own
    advantage step reads and writes back, the generations file's `uid` (the key) and `score`."""
    import inspect

    from verl.trainer import main_ppo
    from verl.trainer.ppo.v1 import trainer_base

    from rollout_audit.integrations.verl_v1 import FIELDS

    assert isinstance(trainer_base.TRAINER_REGISTRY, dict) and callable(trainer_base.register_trainer)
    assert "get_trainer_cls(config.trainer.v1.trainer_mode)" in inspect.getsource(main_ppo.TaskRunnerV1.run)
    assert "ray_init" in inspect.getsource(main_ppo.run_ppo) and "runtime_env" in inspect.getsource(main_ppo.run_ppo)
    assert list(inspect.signature(trainer_base.PPOTrainer._compute_advantage).parameters) == [
        "self",
        "batch",
        "metrics",
    ]
    step = inspect.getsource(trainer_base.PPOTrainer._compute_advantage)
    assert [f for f in FIELDS if f not in ("responses",) and f'"{f}"' not in step] == []
    assert "self.trainer_mode = self.config.trainer.v1.trainer_mode" in inspect.getsource(
        trainer_base.PPOTrainer.__init__
    )
    dump = inspect.getsource(trainer_base.PPOTrainer._log_rollout_data)
    assert '"uid": [batch.keys[i]' in dump and 'rm_scores"].sum(dim=1)' in dump


def test_verl_7956_itself_gae_with_pf_ppo_is_recorded_as_trained_but_not_recomputed(tmp_path, monkeypatch):
    """verl#7956 in its own configuration, with verl's own code: GAE with use_pf_ppo resamples the batch
    (`pow` weighting: the unrewarded rows weigh 1e-8) and V1 writes the advantages back under the
    original keys. The record holds what TransferQueue holds, an unrewarded row's key with a rewarded
    row's advantages; GAE's advantages need the critic's values, so U603 is not run, saying why."""
    import torch
    from transfer_queue import KVBatchMeta

    store = Store()
    samples = _loop_records()
    keys = _put_agent_loop_outputs(store, samples)
    for k in keys:
        store.rows[k]["values"] = torch.zeros_like(store.rows[k]["rm_scores"])
    trainer, config = _trainer(tmp_path, monkeypatch, store)
    config.algorithm.adv_estimator = "gae"
    config.algorithm.use_pf_ppo = True
    config.algorithm.pf_ppo = {"reweight_method": "pow", "weight_pow": 2.0}
    torch.manual_seed(0)
    trainer._compute_advantage(KVBatchMeta(keys=keys, partition_id="train", tags=[{}] * len(keys)), {})
    from verl.trainer.ppo.core_algos import compute_gae_advantage_return

    from rollout_audit.adapters.base import read_dump

    def padded(name):
        return torch.nn.utils.rnn.pad_sequence([store.rows[k][name] for k in keys], batch_first=True)

    mask = padded("response_mask")  # GAE as verl computed it, before the resample (ray_trainer.py:218-234)
    gae, _ = compute_gae_advantage_return(padded("rm_scores"), padded("values"), mask, gamma=1.0, lam=1.0)
    recs = {r["request_id"]: r for r in read_dump(tmp_path / "rollout-audit")}

    def source(i):  # the rows whose advantages the record holds under key i
        got = torch.tensor(recs[keys[i]]["advantages"])
        return [j for j in range(len(keys)) if torch.allclose(got, gae[j, : len(got)], atol=1e-5)]

    assert source(0) and 0 not in source(0) and set(source(0)) <= {1, 3}  # 7c1f_0_0 (reward 0): a rewarded row's
    (tmp_path / "rollout-audit" / "verl-loop.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    rep = json.loads(cli("check", "--from", "verl", tmp_path, *PAGE, "--format", "json").stdout)
    assert (
        "verl's estimator 'gae' has no contract counterpart" in {n["code"]: n["reason"] for n in rep["not_run"]}["U603"]
    )


@pytest.mark.slow
def test_rays_setup_hook_registers_the_audited_trainer_in_an_actor_as_verls_taskrunner_looks_it_up():
    """The page's `+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook`, as verl hands it to
    `ray.init` (main_ppo.py:62-74): in a fresh actor process (verl's TaskRunnerV1 is one), verl's own
    `get_trainer_cls("rollout_audit_sync")` returns the audited subclass of `PPOTrainerSync`."""
    ray = pytest.importorskip("ray")

    from rollout_audit.integrations.verl_v1 import PREFIX, SETUP

    @ray.remote
    class Runner:
        def lookup(self, name):
            from verl.trainer.ppo.v1 import get_trainer_cls

            cls = get_trainer_cls(name)
            return f"{cls.__module__}.{cls.__qualname__}", cls.__mro__[1].__name__

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, runtime_env={"worker_process_setup_hook": SETUP})
    try:
        found = ray.get(Runner.remote().lookup.remote(PREFIX + "sync"), timeout=240)
    finally:
        ray.shutdown()
    assert found == ("rollout_audit.integrations.verl_v1.AuditedPPOTrainerSync", "PPOTrainerSync")
