"""Known third-party noise is filtered from a run's output (DeepSpeed's notices true of every run); any other
warning still shows."""

import logging


def _record(message: str) -> logging.LogRecord:
    return logging.LogRecord("DeepSpeed", logging.WARNING, __file__, 1, message, None, None)


def test_deepspeeds_known_notices_are_filtered_and_nothing_else():
    from adaponder.train.distributed import _KnownNotices, quiet_known_notices

    quiet_known_notices()
    quiet_known_notices()
    filters = [f for f in logging.getLogger("DeepSpeed").filters if isinstance(f, _KnownNotices)]
    assert len(filters) == 1  # once per process
    untested = "**** You are using ZeRO with an untested optimizer, proceed with caution *****"
    assert not filters[0].filter(_record(untested))
    assert filters[0].filter(_record("Skipping step. Attempted loss scale: 65536"))


def test_printed_notices_are_dropped_and_other_lines_passed_on(capsys):
    from adaponder.train.distributed import _printed_notices_dropped

    with _printed_notices_dropped():
        print("DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully")
        print("something DeepSpeed had to say")
    assert capsys.readouterr().out == "something DeepSpeed had to say\n"
