"""Console scripts: ``adaponder-pretrain``, ``adaponder-export``, ``adaponder-finetune-glue`` (besides
``adaponder-prepare``, ``adaponder-eval``, ``adaponder-report``, ...). ``launch/*.py`` are thin shims over these,
so ``deepspeed launch/pretrain.py ...`` keeps working; without the repository,
``deepspeed --module adaponder.cli.pretrain ...`` or ``deepspeed $(which adaponder-pretrain) ...``."""
