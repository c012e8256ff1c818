"""The command-line entry points, one module per command: each has `main(argv=None) -> int` (the exit
status; bad input is one line on stderr and exit status 2) and `run(argv=None)` (the command's work,
returning its result; raises the project's errors)."""
