"""kvhandoff: prove, test and teach the prefill->decode KV-cache handoff.

The installed distribution has this one top-level package; the source tree keeps one folder per
part, and this package reaches them through symbolic links:

| module | source folder | what it is |
|---|---|---|
| `kvhandoff.spec` | `spec/` | the protocol as a pure-Python state machine |
| `kvhandoff.model_checker` | `model_checker/` | the explicit-state and Z3 engines |
| `kvhandoff.impl` | `impl/` | the gRPC + torch implementation |
| `kvhandoff.conformance` | `conformance/` | spec-as-oracle replay and log validation |
| `kvhandoff.cli` | `kvhandoff_cli/` | the `kvhandoff` command (`python -m kvhandoff`) |

Why one namespace: an engine repository, the very user of `kvhandoff conform`, often has its own
`spec/` or `impl/` package, which would shadow generic top-level names. Always import through
`kvhandoff.` (tools/namespace_imports.py --check enforces it): importing a folder under its bare
name too would load the same file twice as two modules, and `isinstance` would fail across them.
"""
