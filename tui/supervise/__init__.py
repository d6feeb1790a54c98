"""Headless orchestration: the supervisor of one launch, multi-host runs, history and hooks.
Used by the console and the command line alike; imports no textual."""
