"""Fuzzer settings. CI runs a bounded number of examples per fuzzer (FUZZ_EXAMPLES, default in each file); a long run:

    FUZZ_EXAMPLES=20000 python -m pytest -n 0 -p no:cacheprovider test/fuzz -s

With -s each fuzzer prints how many cases it ran and how long they took."""
import os

from hypothesis import HealthCheck, settings

settings.register_profile("fuzz", deadline=None, derandomize=os.getenv("FUZZ_RANDOM", "") in ("", "0"),
                          suppress_health_check=list(HealthCheck), database=None)
settings.load_profile("fuzz")


def examples(default: int) -> int:
    return int(os.getenv("FUZZ_EXAMPLES", default))
