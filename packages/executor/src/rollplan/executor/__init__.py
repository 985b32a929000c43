"""rollplan.executor: Ray + vLLM executor applying plans to real engines."""
