"""Shared test setup: offline hub access, deterministic CPU math, tiny configs."""

import os
import sys
import weakref
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("ADAPONDER_SHARED_DATA", REPO.parent / "shared" / "data"))
# No data location has a default outside the checkout: the tests point the variables at ../shared/data.
for _var, _sub in (("ADAPONDER_EVAL_DATA", "eval"), ("ADAPONDER_GLUE_DIR", "glue")):
    if (SHARED_DATA / _sub).is_dir():
        os.environ.setdefault(_var, str(SHARED_DATA / _sub))

torch.set_num_threads(2)


def tiny_config(mode="adaponder", **overrides):
    """Vocab ≤ 1k, width ≤ 128: the unit-test shape."""
    from adaponder.modeling import AdaPonderConfig

    values = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                  vocab_size=97, max_position_embeddings=128, rotary_pct=0.25, use_parallel_residual=True,
                  tie_word_embeddings=False, mode=mode)
    values.update(overrides)
    return AdaPonderConfig(**values)


def tiny_model(mode="adaponder", seed=0, **overrides):
    """A model of :func:`tiny_config`, its weights drawn after ``torch.manual_seed(seed)``, in eval mode."""
    from adaponder.modeling import AdaPonderForCausalLM

    torch.manual_seed(seed)
    return AdaPonderForCausalLM(tiny_config(mode, **overrides)).eval()


_BOUND = weakref.WeakKeyDictionary()


def run_with(model, **settings):
    """Every call of ``model`` that names no ``settings`` runs with ``RunSettings(**settings)`` (a forward pre-hook,
    as the lm-eval model sets them; the config is not touched). Returns the model; :func:`settings_for` gives the
    settings back, for decoders that take them as an argument."""
    from adaponder.modeling.run_settings import RunSettings

    bound = RunSettings(**settings)

    def hook(module, args, kwargs):
        if kwargs.get("settings") is None:
            kwargs["settings"] = bound
        return args, kwargs

    model.register_forward_pre_hook(hook, with_kwargs=True)
    _BOUND[model] = bound
    return model


def settings_for(model):
    """The settings :func:`run_with` bound to ``model`` (default settings when none were)."""
    from adaponder.modeling.run_settings import RunSettings

    return _BOUND.get(model, RunSettings())


@pytest.fixture
def shared_data():
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture
def one_thread():
    """Tiny models run as fast on one thread, and one thread does not stall when the CPU is shared
    (two OpenMP threads wait on each other whenever one is descheduled)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Corpus, tokenizer and prepared data of the tiny training runs (tests/helpers_train.py), once per module."""
    from helpers_train import tiny_data

    return tiny_data(tmp_path_factory.mktemp("tinydata"))


@pytest.fixture(scope="module")
def launcher():
    """Runs launch/pretrain.py in one long-lived process (one torch/DeepSpeed import per module)."""
    from helpers_train import LauncherWorker

    worker = LauncherWorker()
    yield worker
    worker.close()


# -- the two layers -----------------------------------------------------------------------------------------------
# Unit tests run in this process on tiny models and answer in minutes (`bash scripts/test.sh --fast`); a test that
# starts a process (a CLI, DeepSpeed ranks, a study), makes a process group or compiles is marked `integration`
# (`slow` and `deepspeed` imply it). The unit layer holds itself to that: a unit test that starts a process fails,
# naming the marker, so the fast layer cannot grow slow without anyone noticing.
_UNIT_TEST = {"id": None, "started": None}


def _no_process_from_a_unit_test(event, args):
    if event == "subprocess.Popen" and _UNIT_TEST["id"] is not None:
        test, _UNIT_TEST["id"] = _UNIT_TEST["id"], None  # (once: the failure's own reporting may start one)
        _UNIT_TEST["started"] = (test, args[1])  # failed at teardown too, should a library swallow the error
        raise RuntimeError(_started_message(test, args[1]))


def _started_message(test, command) -> str:
    return (f"{test} is a unit test and started a process ({command!r}): mark it @pytest.mark.integration, or keep "
            "it in-process")


sys.addaudithook(_no_process_from_a_unit_test)


@pytest.hookimpl(tryfirst=True)  # before -m selects: `slow` and `deepspeed` tests are deselected by --fast too
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("slow") or item.get_closest_marker("deepspeed"):
            item.add_marker(pytest.mark.integration)
    # the unit layer first (a stable sort: file order within each layer), so a quick failure shows at once
    items.sort(key=lambda item: item.get_closest_marker("integration") is not None)


def _is_unit(item) -> bool:
    return item.get_closest_marker("integration") is None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # from before the test's fixtures are made (a module's shared worker process counts too) to its teardown
    _UNIT_TEST["id"], _UNIT_TEST["started"] = (item.nodeid if _is_unit(item) else None), None


def pytest_runtest_teardown(item):
    _UNIT_TEST["id"] = None


@pytest.fixture(autouse=True)
def _unit_layer_makes_no_process_group(request):
    if not _is_unit(request.node):
        yield
        return
    import torch.distributed as dist

    grouped = dist.is_available() and dist.is_initialized()
    yield
    if _UNIT_TEST["started"] is not None:
        pytest.fail(_started_message(*_UNIT_TEST["started"]), pytrace=False)
    if not grouped and dist.is_available() and dist.is_initialized():
        pytest.fail(f"{request.node.nodeid} is a unit test and made a process group: mark it "
                    "@pytest.mark.integration", pytrace=False)
