"""Runs on the GPU host; see remote_agent.py."""
