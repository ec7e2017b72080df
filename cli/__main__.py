"""`python -m rlfleet.cli ...` is `rlfleet ...` (what the container images run)."""

from rlfleet.cli.main import main

main(prog_name="rlfleet")
