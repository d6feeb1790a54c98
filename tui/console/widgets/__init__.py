"""The console's panes: each draws what its messages carry and nothing else."""
