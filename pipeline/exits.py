"""The exit codes of ``ckpt audit``, whatever format it reads (README: "Exit codes")."""

EXIT_AT_RISK = 1
"""A dangling reference or unreadable metadata: a retained checkpoint cannot be restored."""
EXIT_USAGE = 2
"""Bad usage, or the audit could not run (nothing was checked)."""
EXIT_REFUSED = 3
"""A guard refused the deletion, or some of its deletes (nothing unsafe deleted)."""
EXIT_DELETE_FAILED = 4
"""Some deletes failed (see the log)."""
