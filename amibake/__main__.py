"""`python -m amibake` is the amibake command."""

from amibake.cli import main_entry

main_entry()
