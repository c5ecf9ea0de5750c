"""`python -m fleet` is the fleet command."""

from fleet.cli import main_entry

main_entry()
