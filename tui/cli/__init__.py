"""The command line: the argparse entry (`specconsole`), the multi-host commands, `status`
and the exit codes `wait` promises."""
