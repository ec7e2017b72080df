"""`python -m cli ...` is `rlfleet ...` (what the container images run)."""

from cli.main import main

main(prog_name="rlfleet")
