"""The plugin's fixed settings: the vLLM versions its internals are checked against, and the
environment variable that switches recording on."""

SUPPORTED_VLLM = ("0.32.0",)
TRACE_DIR_ENV = "SVT_TRACE_DIR"
