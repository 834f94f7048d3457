"""``adaponder-reasoning-data``: write the multi-hop reasoning corpus of :mod:`adaponder.data.reasoning`.

Command line::

    adaponder-reasoning-data OUT_DIR [--symbols 256 --max-hops 4 --train-docs 20000 --seed 0]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import asdict

from adaponder.cli.doc import description
from adaponder.data import reasoning
from adaponder.data.errors import DataError
from adaponder.data.reasoning import MultiHopSpec, write_multihop


def main(argv: Sequence[str] | None = None) -> int:
    defaults = MultiHopSpec()
    p = argparse.ArgumentParser(prog="adaponder-reasoning-data", description=description(reasoning.__doc__, __doc__),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir")
    for name, value in asdict(defaults).items():
        p.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    p.add_argument("--overwrite", action="store_true")
    args = vars(p.parse_args(argv))
    out, overwrite = args.pop("out_dir"), args.pop("overwrite")
    try:
        meta = write_multihop(out, MultiHopSpec(**args), overwrite=overwrite)
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {out}: {meta['splits']['train']['documents']} train / {meta['splits']['val']['documents']} val "
          f"documents of {args['doc_tokens']} tokens, vocabulary {meta['vocab_size']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
