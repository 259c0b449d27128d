"""kvhandoff's implementation: prefill, decode and router as gRPC servers with torch KV pages.

Written independently of `spec/` (never imported here) so that conformance testing against the
spec means something. Start with `impl.cluster.start_cluster`, the protocol cores in `impl.core`,
the modes in `impl.modes`, and the exception tree in `impl.errors`; docs/impl.md has the API.
"""
