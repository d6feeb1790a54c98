"""specconsole: launch and supervise LLM inference servers on GPU hosts over SSH."""

__version__ = "0.1.0"
