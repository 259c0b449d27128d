"""The conformance harness service (harness.proto) and its generated code under gen/."""
