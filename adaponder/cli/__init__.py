"""Every command line of adaponder: one ``adaponder`` command (:mod:`.main`) whose subcommands are the ``main(argv)``
of one module each here (argument parsing here, the work in the library modules they call); ``adaponder --help``
lists them, ``python -m adaponder.cli.<module>`` runs one without the console script.

``prepare``, ``reasoning_data``, ``plan``, ``pretrain``, ``finetune_glue``, ``export_hf``, ``train_report``,
``lm_eval``, ``perplexity``, ``difficulty``, ``dial``, ``halting``, ``report``, ``study``, ``bench``
(``adaponder prepare``, ``reasoning-data``, ``plan``, ``pretrain``, ``finetune``, ``export``, ``train-report``,
``eval``, ``perplexity``, ``difficulty``, ``dial``, ``halting``, ``report``, ``study``, ``bench``); the older
``adaponder-NAME`` console scripts are aliases of the same functions. Shared pieces: :mod:`.errors` (one ``error:``
line, exit code 2), :mod:`.eval_args` (the evaluation commands' options), :mod:`.doc` (``--help`` text).

``launch/*.py`` and ``eval/perplexity.py``, ``eval/report.py`` are thin shims over these, so
``deepspeed launch/pretrain.py ...`` keeps working as the multi-process entry; without the repository,
``deepspeed --module adaponder.cli.pretrain ...``."""
