"""What the tests do differently under ``make mutate`` (docs/testing.md#mutation-testing).

mutmut sets ``MUTANT_UNDER_TEST`` in every process it runs tests in (its stats run, the clean run and
each mutant), and runs each mutant against every selected test that calls the mutated function. A
decoder mutant runs the wire property tests, so there they draw a fixed, smaller set of examples
(the same ones for every mutant) and a failure is not shrunk: the failure alone kills the mutant.
A normal run (``make test``, CI) never has the variable and keeps each test's own budget.
"""

from __future__ import annotations

import os

from hypothesis import Phase, settings

MUTATING = "MUTANT_UNDER_TEST" in os.environ

#: examples per property test under mutmut
MUTANT_EXAMPLES = 60

settings.register_profile("mutmut", max_examples=MUTANT_EXAMPLES, derandomize=True, database=None, deadline=None,
                          phases=(Phase.explicit, Phase.generate))


def examples(n: int) -> int:
    """``n``, a property test's own budget; under mutmut, at most :data:`MUTANT_EXAMPLES`."""
    return min(n, MUTANT_EXAMPLES) if MUTATING else n
