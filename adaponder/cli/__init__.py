"""Every command line of adaponder, one module per command (the console script's name, or
``python -m adaponder.cli.<module>``): argument parsing here, the work in the library modules they call.

``pretrain``, ``export_hf``, ``finetune_glue``, ``plan``, ``study`` (``adaponder-pretrain``, ``-export``,
``-finetune-glue``, ``-plan``, ``-study``); ``prepare``, ``reasoning_data`` (``adaponder-prepare``,
``-reasoning-data``); ``lm_eval``, ``perplexity``, ``halting``, ``dial``, ``difficulty``, ``report``,
``train_report`` (``adaponder-eval``, ``-perplexity``, ``-halting``, ``-dial``, ``-difficulty``, ``-report``,
``-train-report``). Shared pieces: :mod:`.errors` (one ``error:`` line, exit code 2), :mod:`.eval_args` (the
evaluation commands' options), :mod:`.doc` (``--help`` text).

``launch/*.py`` and ``eval/perplexity.py``, ``eval/report.py`` are thin shims over these, so
``deepspeed launch/pretrain.py ...`` keeps working; without the repository,
``deepspeed --module adaponder.cli.pretrain ...`` or ``deepspeed $(which adaponder-pretrain) ...``."""
