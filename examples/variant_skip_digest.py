"""A protocol change written as a variant: decode skips the digest and checks only the page count.

Run it:  kvhandoff check --variant examples/variant_skip_digest.py

A reviewer proposing "the digest is expensive, the count is enough" writes this file. The checker
answers with the shortest run where the count matches but the data does not: prefill truncates a
prompt it cannot hold (a deployment where prefill's pool is smaller than decode's) and claims the
whole grant, and decode generates from pages nobody wrote for the request.
"""

from kvhandoff.spec.variants import REFERENCE

VARIANT = REFERENCE.derive(
    "skip_digest",
    "Decode checks the completion's page count but not the digest.",
    explanation="A proposed optimisation: drop the digest, keep the count.",
    breaks=("decode_reads_only_validated_pages",),
    validation="count_only",
    oversize="truncate",
    completion="local",
)
