"""`--scenario sequential`, for the tests that run `kvhandoff check`, `review` or `matrix`.

The CLI's default scenario is `wide` (two requests in flight, two faults; about 20 s for the
explorer); the tests' expectations (state counts, counterexample lengths, verdicts on small
`--set`s) are stated on `Config()`'s defaults, the `sequential` scenario, so they name it."""

SEQUENTIAL = ("--scenario", "sequential")
