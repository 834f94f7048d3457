"""``adaponder-plan`` (``python launch/plan.py`` in a checkout): the capacity plan of a training run before launching
it (:mod:`adaponder.train.plan`; ``--help`` shows its description)."""

from __future__ import annotations

import argparse
import json
import sys

from adaponder.cli.errors import report
from adaponder.resources import find_config
from adaponder.train import plan
from adaponder.train.config import TrainConfigError, load_config
from adaponder.train.plan import DEVICES, format_plan, make_plan, plan_dict


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=plan.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="training YAML (configs/*.yaml, or a shipped preset's name)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], nargs="+", metavar="KEY=VALUE",
                    help="override config values as in launch/pretrain.py (e.g. train.micro_batch=8)")
    ap.add_argument("--gpus", type=int, default=8, help="data-parallel ranks (default 8)")
    ap.add_argument("--gpu", default="h100-80gb", choices=sorted(DEVICES), help="device from the built-in table")
    ap.add_argument("--gpu-mem-gb", type=float, help="override: memory per GPU (GiB)")
    ap.add_argument("--gpu-tflops", type=float, help="override: dense peak TFLOP/s per GPU at the run's precision")
    ap.add_argument("--mfu", type=float, default=0.4, help="assumed model-FLOPs utilisation (default 0.4)")
    ap.add_argument("--reserve-gb", type=float, default=3.0,
                    help="GiB per GPU held back for the CUDA context, NCCL and fragmentation (default 3)")
    ap.add_argument("--json", action="store_true", help="print the plan as JSON instead of tables")
    args = ap.parse_args(argv)

    overrides = [o for group in args.overrides for o in group]
    try:
        cfg = load_config(find_config(args.config), overrides)
        p = make_plan(cfg, args.gpus, DEVICES[args.gpu], mfu=args.mfu, memory_gib=args.gpu_mem_gb,
                      peak_flops=args.gpu_tflops * 1e12 if args.gpu_tflops else None, reserve_gib=args.reserve_gb)
    except TrainConfigError as err:
        return report(err)  # one line, exit code 2
    print(json.dumps(plan_dict(p), indent=2) if args.json else format_plan(p))
    return 0


if __name__ == "__main__":
    sys.exit(main())
