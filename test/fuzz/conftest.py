"""Fuzzer settings. CI runs a bounded number of examples per fuzzer (FUZZ_EXAMPLES, default in each file), the same
cases every run; a long run with fresh random cases:

    FUZZ_EXAMPLES=20000 FUZZ_RANDOM=1 python -m pytest -n 0 -p no:cacheprovider test/fuzz -s

With -s each fuzzer prints how many cases it ran. The settings apply to the fuzzers only (no global profile)."""
import os

from hypothesis import HealthCheck, settings


def fuzz_settings(default_examples: int) -> settings:
    return settings(max_examples=int(os.getenv("FUZZ_EXAMPLES", default_examples)), deadline=None, database=None,
                    derandomize=os.getenv("FUZZ_RANDOM", "") in ("", "0"), suppress_health_check=list(HealthCheck))
