"""GuardedAdamW (adaponder.train.optim): a finite step is AdamW's; a non-finite gradient anywhere, or a veto,
leaves parameters and optimizer state bit-identical; frozen groups are left out; one host sync per check."""

import copy

import pytest
import torch

from adaponder.train.optim import GuardedAdamW


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(4, 3), (3,), (2, 5), (5,), (1,)]
    return [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in shapes]


def _set_grads(params, seed=1):
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)


def _groups(params):
    return [{"params": params[:2], "weight_decay": 0.1}, {"params": params[2:], "weight_decay": 0.0}]


def _snapshot(params, opt):
    return [p.detach().clone() for p in params], copy.deepcopy(opt.state_dict()["state"])


def _assert_same(before, params, opt):
    old_params, old_state = before
    for a, b in zip(old_params, params):
        assert torch.equal(a, b.detach())
    new_state = opt.state_dict()["state"]
    assert old_state.keys() == new_state.keys()
    for i in old_state:
        assert old_state[i].keys() == new_state[i].keys()
        for key, val in old_state[i].items():
            assert torch.equal(val, new_state[i][key]), (i, key)


def test_finite_step_is_exactly_adamw():
    ours, ref = _params(), _params()
    kw = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    opt, ref_opt = GuardedAdamW(_groups(ours), **kw), torch.optim.AdamW(_groups(ref), **kw)
    for step in range(3):
        _set_grads(ours, seed=step)
        _set_grads(ref, seed=step)
        before = [p.detach().clone() for p in ours]
        opt.step()
        ref_opt.step()
        assert not opt.last_skipped
        assert all(not torch.equal(a, p.detach()) for a, p in zip(before, ours))
        for a, b in zip(ours, ref):
            assert torch.equal(a, b)
    assert all(int(s["step"]) == 3 for s in opt.state.values())


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("which", range(5))
def test_a_nonfinite_value_in_any_one_gradient_skips_the_step(which, bad):
    params = _params()
    opt = GuardedAdamW(_groups(params), lr=1e-2)
    _set_grads(params)
    opt.step()  # Adam state exists (step 1)
    _set_grads(params, seed=2)
    params[which].grad.view(-1)[-1] = bad
    before = _snapshot(params, opt)
    opt.step()
    assert opt.last_skipped
    _assert_same(before, params, opt)


def test_veto_skips_and_a_frozen_group_is_left_out():
    params = _params()
    opt = GuardedAdamW(_groups(params), lr=1e-2)
    _set_grads(params)
    opt.step()
    before = _snapshot(params, opt)
    opt.veto = True
    opt.step()
    assert opt.last_skipped
    _assert_same(before, params, opt)

    opt.veto, opt.last_skipped = False, False
    opt.param_groups[0]["frozen"] = True
    frozen_before = [p.detach().clone() for p in params[:2]]
    frozen_state = [copy.deepcopy(opt.state[p]) for p in params[:2]]
    live_before = [p.detach().clone() for p in params[2:]]
    opt.step()
    assert not opt.last_skipped
    assert all(torch.equal(a, p.detach()) for a, p in zip(frozen_before, params[:2]))
    assert all(torch.equal(s["exp_avg"], opt.state[p]["exp_avg"]) for s, p in zip(frozen_state, params[:2]))
    assert all(not torch.equal(a, p.detach()) for a, p in zip(live_before, params[2:]))
    assert len(opt.param_groups) == 2  # restored after the step

    # A frozen group's gradients are still checked: a NaN there skips the whole step.
    params[0].grad.view(-1)[0] = float("nan")
    before = _snapshot(params, opt)
    opt.step()
    assert opt.last_skipped
    _assert_same(before, params, opt)


def test_large_finite_gradients_are_finite():
    """The check looks at every value, not at a norm that could overflow (fp16 grads near 65504)."""
    p = torch.nn.Parameter(torch.zeros(1024, dtype=torch.float16))
    opt = GuardedAdamW([p], lr=1e-3)
    p.grad = torch.full((1024,), 6.0e4, dtype=torch.float16)
    assert not opt._nonfinite_grads(opt.param_groups)
    p.grad[3] = float("inf")
    assert opt._nonfinite_grads(opt.param_groups)


def test_one_host_sync_per_check(monkeypatch):
    """The finiteness of all gradients reaches the host once, however many tensors there are."""
    params = [torch.nn.Parameter(torch.zeros(3)) for _ in range(20)]
    opt = GuardedAdamW([{"params": params[:10]}, {"params": params[10:]}], lr=1e-3)
    for p in params:
        p.grad = torch.ones(3)
    params[7].grad[1] = float("nan")
    syncs = []
    for name in ("item", "__bool__", "tolist", "__float__", "__int__"):
        real = getattr(torch.Tensor, name)

        def counted(self, *args, _real=real, _name=name, **kwargs):
            syncs.append(_name)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    assert opt._nonfinite_grads(opt.param_groups)
    assert len(syncs) == 1, syncs
    syncs.clear()
    params[7].grad[1] = 1.0
    assert not opt._nonfinite_grads(opt.param_groups)
    assert len(syncs) == 1, syncs


_ZERO3_GROUPS = r"""
import os, torch, torch.distributed as dist
from transformers.integrations import HfDeepSpeedConfig
from adaponder.modeling import AdaPonderConfig, AdaPonderForCausalLM
from adaponder.train.optim import param_groups

os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="%d")
dist.init_process_group("gloo", rank=0, world_size=1)
config = AdaPonderConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=32, mode="adaponder", passes=2)
plain = {g["name"]: len(g["params"]) for g in param_groups(AdaPonderForCausalLM(config), 0.1)}
ds = {"train_micro_batch_size_per_gpu": 1, "train_batch_size": 1, "zero_optimization": {"stage": 3}}
hf_ds = HfDeepSpeedConfig(ds)
partitioned = AdaPonderForCausalLM._from_config(config)
assert all(p.numel() == 0 or hasattr(p, "ds_shape") for p in partitioned.parameters())
assert any(hasattr(p, "ds_shape") and p.ndim < len(p.ds_shape) for p in partitioned.parameters())
zero3 = {g["name"]: len(g["params"]) for g in param_groups(partitioned, 0.1)}
print("plain", plain, "zero3", zero3)
assert zero3 == plain, (plain, zero3)
dist.destroy_process_group()
"""


@pytest.mark.integration
def test_zero3_partitioned_matrices_are_decayed_like_full_ones(tmp_path):
    """Parameters built inside zero.Init are empty 1-D partitions; the groups must follow their full shape."""
    import subprocess
    import sys

    from helpers_train import cpu_env, free_port

    script = tmp_path / "groups.py"
    script.write_text(_ZERO3_GROUPS % free_port())
    done = subprocess.run([sys.executable, str(script)], env=cpu_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "backbone_no_decay" in done.stdout
