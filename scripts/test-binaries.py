#!/usr/bin/env python3
"""Reads cargo's JSON messages (`cargo test --no-run --message-format=json...`) on
stdin and prints each test binary it built, one per line, as
`label<TAB>path<TAB>package directory`, in the order `cargo test` runs them: package
by package, the library's unit tests, the binaries', the integration tests, the
benchmarks, the examples' tests (each group by name), then the examples built to be
run, labelled `example NAME`. The label of a test is its target's source, relative to
the workspace root. Compiler
messages that cargo rendered pass through to stderr."""

import json
import os
import sys

ORDER = {"lib": 0, "bin": 1, "test": 2, "bench": 3, "example": 4}
found = []
for line in sys.stdin:
    try:
        message = json.loads(line)
    except json.JSONDecodeError:
        sys.stderr.write(line)
        continue
    if message.get("reason") == "compiler-message":
        rendered = (message.get("message") or {}).get("rendered")
        if rendered:
            sys.stderr.write(rendered)
        continue
    if message.get("reason") != "compiler-artifact":
        continue
    if not message.get("executable"):
        continue
    target = message["target"]
    if not message["profile"]["test"]:
        # An example built as a program (to run, not to test): listed as
        # `example NAME`, for a script that runs it without building it again.
        if "example" in target["kind"]:
            package = os.path.dirname(message["manifest_path"])
            found.append((package, 5, target["name"], f"example {target['name']}",
                          message["executable"]))
        continue
    kind = next((k for k in target["kind"] if k in ORDER), None)
    if kind is None:
        continue
    source = os.path.relpath(target["src_path"])
    label = f"unittests {source}" if kind in ("lib", "bin", "example") else source
    package = os.path.dirname(message["manifest_path"])
    found.append((package, ORDER[kind], target["name"], label, message["executable"]))

if not found:
    sys.exit("test-binaries: cargo reported no test binary")
for package, _, _, label, executable in sorted(found):
    print(f"{label}\t{executable}\t{package}")
